"""Templates of `python -m env_service.new`: the files a new environment project starts from.

`{{name}}` and `{{Class}}` in a template are replaced by the environment's name and its class-name form.
"""
