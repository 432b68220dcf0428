"""``capreward serve``: an OpenRLHF-compatible reward server (POST /get_reward) on a capreward reward."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from .. import registry
from ..adapters.factory import reward_names
from ..default_models import DEFAULT_CLIP, DEFAULT_LLAVA
from ..metrics.harmonic import HARMONIC_MEANS
from ..metric_flags import adapter_flags, add_metric_flags, metric_flag_values
from .common import (CLIError, add_caption_budget_options, add_device_option, add_media_limit_options, metric_name, real_number,
                     spelled_aliases, whole_number)


def run(args: argparse.Namespace) -> int:
    from ..adapters.factory import DEFAULT_FLEUR, RewardOptions, build_reward
    from ..server.http import make_server

    check_media_options(args)  # before any model is loaded

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        limits = server_limits(args)
        prompt_tokens = None
        if args.prompt_tokenizer is not None:  # before any model is loaded: a bad path fails in one line
            from ..adapters.prompt_tokens import PromptTokens

            prompt_tokens = PromptTokens(os.path.expanduser(args.prompt_tokenizer))
    except ValueError as exc:
        print(f"capreward serve: {exc}", file=sys.stderr)
        return 2
    options = RewardOptions(
        clip_model=args.clip_model, fleur_model=args.fleur_model or DEFAULT_FLEUR, device=args.device,
        precision=None if args.precision == "fp32" else args.precision, dtype=args.dtype, idf=args.idf,
        frames=None if args.frames == 0 else args.frames, w=args.w, composite=args.composite,
        harmonic_mean=args.harmonic_mean, judge_url=args.judge_url, judge_model=args.fleur_model,
        judge_api_key_env=args.judge_api_key_env, judge_top_logprobs_cap=args.judge_top_logprobs_cap,
        metric_options=metric_flag_values(args, adapter_flags()),
    )
    try:
        reward = build_reward(args.reward, options)
    except ValueError as exc:
        print(f"capreward serve: {exc}", file=sys.stderr)
        return 2
    load_models = getattr(reward, "load_models", None)
    if load_models is not None:
        load_models()  # a missing model fails here, in one line, not on every request after "ready"
    server = make_server(reward, args.host, args.port, fallback=args.fallback, media_root=args.media_root,
                         limits=limits, allow_any_path=args.allow_any_path, prompt_tokens=prompt_tokens)

    def stop(signum, _frame):
        # shutdown() waits for serve_forever to return, so it must run outside the serving thread
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"capreward serve: ready on {server.url}/get_reward (reward {args.reward}, unscorable samples get "
          f"{server.service.fallback:g})", file=sys.stderr, flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        if not server.close_gracefully():
            print("capreward serve: requests still running at shutdown were dropped", file=sys.stderr, flush=True)
    print("capreward serve: stopped", file=sys.stderr, flush=True)
    return 0


def check_media_options(args: argparse.Namespace) -> None:
    """Refuse a server that could only answer the fallback: without ``--media-root`` every label's path is
    refused (and OpenRLHF ignores the ``errors`` field, so a run would train on constant rewards), unless
    ``--allow-any-path`` says labels may name any file; a media root must be a directory."""
    if args.media_root is None:
        if not args.allow_any_path:
            raise CLIError(
                "--media-root DIR is required: without it the server reads no file, so every sample that names an "
                "image or video gets the fallback (and OpenRLHF ignores 'errors': a run would train on constant "
                "rewards). Pass --media-root with the folder of the visuals, or --allow-any-path to let labels "
                "name any file this process can read (trusted clients only)")
    elif not os.path.isdir(os.path.expanduser(args.media_root)):
        raise CLIError(f"--media-root: {args.media_root!r} is not a directory")


def server_limits(args: argparse.Namespace):
    """The :class:`~capreward.server.http.ServerLimits` of the command line (ValueError for
    inconsistent ones)."""
    from ..server.http import ServerLimits

    return ServerLimits(max_body_bytes=args.max_body_bytes, max_items=args.max_items,
                        max_concurrent=args.max_concurrent, queue_timeout=args.queue_timeout,
                        header_timeout=args.header_timeout, read_timeout=args.read_timeout,
                        max_connections=args.max_connections, max_connections_per_peer=args.max_connections_per_peer,
                        reserved_connections=args.reserved_connections, max_header_bytes=args.max_header_bytes,
                        max_json_depth=args.max_json_depth, max_string_chars=args.max_string_chars,
                        max_batch_size=args.max_batch_size, max_wait=args.max_wait_ms / 1000.0)


def reward_name(name: str) -> str:
    """The one spelling of a reward name (the aliases of capreward.names mapped); unknown names pass
    through to argparse's choices check."""
    return metric_name(name)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="serve a reward over HTTP for OpenRLHF (--reward.remote_url http://HOST:PORT/get_reward; "
                      "OpenRLHF before 0.10: --remote_rm_url)",
        description=__doc__,
    )
    p.add_argument("--reward", default="emscore", choices=reward_names(), type=reward_name,
                   help=f"the reward served (aliases: {spelled_aliases(reward_names())})")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=whole_number(0, 65535), default=5000, help="0: pick a free port (printed on stderr when ready)")
    judges = "/".join(registry.on_backbone("chat_judge"))
    p.add_argument("--clip-model", default=DEFAULT_CLIP, help=f"CLIP for {'/'.join(registry.on_backbone('clip'))}: name/tag, .pt path, ...")
    p.add_argument("--judge-model", "--fleur-model", dest="fleur_model", metavar="MODEL",
                   help=f"the judge of {judges}: a local LLaVA judge (hub name or directory; default: "
                        f"{DEFAULT_LLAVA}), or with --judge-url the served model name")
    p.add_argument("--judge-url", help=f"an OpenAI-compatible server for {judges} (vLLM: http://HOST:8000/v1)")
    p.add_argument("--judge-api-key-env", default="OPENAI_API_KEY",
                   help="environment variable holding the judge server's API key (unset: none sent)")
    p.add_argument("--judge-top-logprobs-cap", type=whole_number(1), default=20,
                   help="the most top_logprobs the judge server serves (vLLM --max-logprobs; default 20)")
    add_metric_flags(p, adapter_flags())  # each metric's own options the adapters take, from its spec
    p.add_argument("--composite", default="emscore=1.0,hallucination=1.0",
                   help="terms of --reward composite: name=weight,... (plus repetition/truncation/length guards)")
    p.add_argument("--idf", help="EMScore idf corpus: a text file with one caption per line (default: no idf)")
    p.add_argument("--frames", type=whole_number(0), default=10, help="frames per video (0: all)")
    p.add_argument("--w", type=real_number(above=0), help="CLIP-S scale (default: 2.5)")
    p.add_argument("--harmonic-mean", default="sign-safe", choices=list(HARMONIC_MEANS),
                   help="how emscore's F (from P and R) and clip_s's RefCLIP-S are formed: sign-safe = 2ab/(a+b) "
                        "when both parts are positive, else the smaller part (in range, never rewards opposite "
                        "signs); released = the papers' 2ab/(a+b), clipped to the reward's range")
    add_device_option(p)
    add_media_limit_options(p)
    add_caption_budget_options(p)
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"], help="CLIP precision")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"],
                   help="judge dtype for fleur (default: float16 on GPU, float32 on CPU)")
    p.add_argument("--media-root", help="the only directory whose files labels may name (relative paths are resolved "
                   "against it; paths that resolve outside it, symlinks included, are refused). Required unless "
                   "--allow-any-path is given: none would mean that no file is ever read, so that every sample with "
                   "an image or video would get the fallback; the server refuses to start then")
    p.add_argument("--allow-any-path", action="store_true",
                   help="let labels name any file this process can read (trusted clients only); with --media-root, "
                   "relative paths are still joined to it")
    p.add_argument("--prompt-tokenizer", metavar="DIR", default=None,
                   help="the policy's tokenizer (a local directory): each response starts where its prompt's tokens "
                   "end in the query (OpenRLHF decodes prompt + response ids), not after the prompt's first "
                   "occurrence as text; a query that does not begin with them (after special tokens and padding) "
                   "is answered 400")
    p.add_argument("--fallback", type=real_number(), default=None,
                   help="reward of a sample that cannot be scored (empty completion, unreadable or refused file, invalid "
                        "references); default: the bottom of the reward's range (emscore -1; clip_s -1, where RefCLIP-S "
                        "reaches, 0 with --harmonic-mean released; hallucination -1; fleur 0; composite the sum of its "
                        "terms' and guards' bottoms), so an unscorable sample never outranks a scored one")
    p.add_argument("--max-body-bytes", type=whole_number(1), default=16 * 1024 * 1024, help="larger requests get 413")
    p.add_argument("--max-items", type=whole_number(1), default=4096, help="more queries per request get 413")
    p.add_argument("--max-concurrent", type=whole_number(1), default=None,
                   help="batches scored at once, each in its own thread; others wait (default: 1 with batching, as a "
                   "merged batch already uses every core; 4 with --max-batch-size 0). Raise it when requests differ "
                   "much in size, so that one slow batch does not stall the others")
    p.add_argument("--queue-timeout", type=real_number(above=0), default=120.0, help="seconds a request waits for its batch to start before 503")
    p.add_argument("--max-json-depth", type=whole_number(1), default=32, help="deeper JSON nesting in a request gets 400 naming the field")
    p.add_argument("--max-string-chars", type=whole_number(1), default=1 << 18,
                   help="a longer string anywhere in a request gets 400 naming the field")
    p.add_argument("--max-header-bytes", type=whole_number(1), default=64 * 1024, help="a longer request line and headers get 431")
    p.add_argument("--header-timeout", type=real_number(above=0), default=10.0,
                   help="seconds a request's line and headers may take to arrive (from the connection, or from the "
                   "previous answer: idle keep-alive connections are closed after it); slower clients are disconnected")
    p.add_argument("--read-timeout", type=real_number(above=0), default=30.0,
                   help="seconds a whole request (headers and body) may take to arrive, from the same start; else 408")
    p.add_argument("--max-connections", type=whole_number(1), default=128, help="connections served at once; more get 503")
    p.add_argument("--max-connections-per-peer", type=whole_number(1), default=None,
                   help="connections one client address (an IPv6 /64) may hold at once; more get 503 "
                   "(default: half of --max-connections)")
    p.add_argument("--reserved-connections", type=whole_number(0), default=None,
                   help="of --max-connections, how many only addresses holding no connection may take, so that busy "
                   "clients cannot shut out others (default: an eighth of --max-connections)")
    p.add_argument("--max-batch-size", type=whole_number(0), default=64,
                   help="most samples of concurrent requests merged into one scorer call (0: no merging)")
    p.add_argument("--max-wait-ms", type=real_number(minimum=0), default=5.0,
                   help="milliseconds a batch waits for more requests after its oldest arrived")
    p.add_argument("--verbose", action="store_true", help="log every request")
    p.set_defaults(func=run)
