"""torch.compile of the lean decode step (SmolLM2 bf16, 1 row, static shapes) against eager: compile time and step time.

    PACK=0 python benchmarks/speed/compile_decode.py

Dynamo cannot trace the oneDNN-prepacked weights (an opaque tensor layout), so the compiled step runs on plain
bf16 weights (`LeanLlama(pack=False)`); compare its step time with the packed eager step of
`benchmarks/speed/forward.py`. One thread, timed by CPU time (a loaded machine); compile time also by the wall clock,
since inductor compiles in worker processes. Prints plain lines (compile seconds, then ms per step, eager and
compiled, twice).
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from benchmarks.speed.rollout import build_prompts  # noqa: E402
from engine.kv_slots import SlotCache  # noqa: E402
from engine.lean_llama import LeanLlama  # noqa: E402
from engine.models import load_model  # noqa: E402

torch.set_num_threads(1)
clock = time.process_time
with torch.inference_mode():
    m, tok = load_model("smollm2", dtype=torch.bfloat16)
    lean = LeanLlama(m, pack=os.environ.get("PACK") == "1")
    prompt = build_prompts(tok, 1, 1, 0)[0]
    cache = SlotCache(m.config, torch.bfloat16, 1, 2048)
    cache.begin_prefill(1, len(prompt))
    lean.prefill(torch.tensor([prompt]), cache, None)
    cache.end_prefill([len(prompt)])
    tokens = torch.tensor([100])

    def step(fn) -> float:
        began = clock()
        mask = cache.begin_decode()
        try:
            fn(tokens, cache, mask)
        finally:
            cache.end_decode()
        cache.lengths -= 1  # the same context every step
        return clock() - began

    compiled = torch.compile(lean.decode, dynamic=False)
    wall, cpu = time.perf_counter(), clock()
    step(compiled)
    print("compile wall s", round(time.perf_counter() - wall, 1), "cpu s", round(clock() - cpu, 1), flush=True)
    for name, fn in (("eager", lean.decode), ("compiled", compiled)) * 2:
        print(name, round(min(step(fn) for _ in range(7)) * 1000, 1), "ms cpu", flush=True)
