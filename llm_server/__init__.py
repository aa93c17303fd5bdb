"""The bundled OpenAI-compatible model server: `python -m llm_server --port PORT --model smollm2|tiny|<HF dir>`.

Routes (all JSON; errors are `{"error": {"code", "message", "details"}}`):
- `GET /v1/models`: the one served model (`id` is `--served-model-name`, default `--model`).
- `POST /v1/chat/completions`: OpenAI chat; messages rendered with the model's chat template
  (assistant `tool_calls` and `tool` messages included; with `tools`, Hermes `<tool_call>` blocks
  in the output come back as `tool_calls`). temperature (0 = greedy), top_p, max_tokens /
  max_completion_tokens, stop, n, seed, logprobs + top_logprobs, plus vLLM's stop_token_ids,
  add_generation_prompt and continue_final_message.
- `POST /v1/completions`: OpenAI completions on one prompt: text, a list of token ids, or
  `prompt_token_ids` (token in, token out); logprobs (int) gives OpenAI's logprobs object.
- Every completion response: top-level `prompt_token_ids` and `policy_version`; per choice
  `token_ids` (EOS / stop token included when it ended the row) and `token_logprobs`
  (log_softmax of the raw logits at each sampled token, whatever the temperature / top_p).
- Structured outputs on both routes: OpenAI `response_format` (`json_schema`, `json_object`), vLLM
  `structured_outputs` (`choice`, `regex`, `json`, `grammar`; also the older `guided_*` fields), and on
  chat `tool_choice: "required"` or a named tool (one forced `<tool_call>`). A per-row llguidance mask
  inside the batch (`engine/grammar.py`); logprobs stay those of the raw model; malformed constraints
  and ones that compile longer than `--grammar-timeout-s` are 400s. `/v1/models` lists the capability.
- `POST /tokenize` / `POST /detokenize`: vLLM's shapes, same template as chat.
- `POST /v1/weights {"path", "policy_version"?}`: load an HF directory or state-dict file once the
  running rows finish; `GET /v1/weights`: the current `policy_version`.
- The gateway: `POST /v1/episodes`, `POST /v1/episodes/{id}/chat/completions` (or the `X-Evolver-Episode`
  header on `/v1/chat/completions`), `POST /v1/episodes/{id}/end`, `GET /v1/episodes/{id}`: an agent's calls
  recorded per episode, token for token (`llm_server.gateway`, `llm_server.episodes`). Chat streams
  (`stream: true`, server-sent events).
- `GET /v1/stats` (and `/metrics`): requests, rows, prefill_batches, decode_steps, forward_batches,
  prompt_tokens, generated_tokens, max_rows_in_batch, weight_updates, active_rows, queued_requests,
  and `structured_outputs` (constrained rows/tokens, mixed decode steps, mask time, grammar cache);
  `/v1/stats` also weight_uploads (the updates that came as `POST /v1/weights/upload` bodies).

Typed client: `llm_server.client.LLMServerClient`.
"""
