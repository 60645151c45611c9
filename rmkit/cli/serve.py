"""`rmkit serve --model DIR`: score a reward model over HTTP for RL trainers (see `rmkit.serve.server`)."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import signal
import socket
import sys
from pathlib import Path

from rmkit.cli.arguments import float_at_least, port, positive_int, sequence_length
from rmkit.errors import ConfigError
from rmkit.inference import DTYPES
from rmkit.models.setup import check_device


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rmkit serve", description=__doc__)
    p.add_argument("--model", required=True, help="reward-model directory (rmkit export or HF classifier)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    p.add_argument("--port", type=port, default=8000, help="default 8000")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on scoring routes")
    p.add_argument("--open-route", action="append", default=[], metavar="PATH",
                   help="let this scoring route answer without --api-key, for clients that cannot send headers "
                        "(OpenRLHF: /get_reward; verl: /classify, /v1/embeddings); repeatable. Use only on "
                        "loopback or a private network")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--max-batch-tokens", type=positive_int, default=None,
                   help="padded tokens per forward pass (default: 1024 on a CPU, 16384 on a GPU)")
    p.add_argument("--max-batch-size", type=positive_int, default=256, help="rows per forward pass")
    p.add_argument("--batch-window-ms", type=float_at_least(0.0), default=5.0,
                   help="how long a request waits for others to share its batch")
    p.add_argument("--max-length", type=sequence_length, default=None,
                   help="longest input in tokens (default: the model's scoring_contract.json, as eval and score)")
    p.add_argument("--overlong", choices=("truncate", "refuse"), default="truncate",
                   help="inputs over --max-length: cut as every rmkit path cuts them (oldest conversation "
                        "turns first, then keep the leading special tokens and the END), or answer 400")
    p.add_argument("--max-inputs", type=positive_int, default=1024, help="inputs per request (413 over it)")
    p.add_argument("--max-body-bytes", type=positive_int, default=16 * 1024 * 1024, help="request size (413 over it)")
    p.add_argument("--normalize", action="store_true",
                   help="serve (reward - mean) / std with the model's reward_stats.json")
    p.add_argument("--attribute-weights", default=None,
                   help="comma-separated weights turning a K-attribute regression model into one reward")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def parse_weights(text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(w) for w in text.split(",")]
    except ValueError as err:
        raise ConfigError("attribute-weights", f"must be comma-separated numbers, got {text!r}") from err


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    import uvicorn  # the serve extra; imported here so `rmkit --help` does not need it

    from rmkit.serve.server import SCORING_ROUTES, create_app

    for path in args.open_route:
        if path not in SCORING_ROUTES:
            raise ConfigError("open-route", f"{path!r} is not a scoring route (one of {', '.join(SCORING_ROUTES)})")

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    check_host(args.host, args.port)
    check_device(args.device)
    if not Path(args.model).is_dir():
        raise ConfigError("model", f"{args.model} is not a model directory")
    try:
        engine = _load_engine(args)
    except (OSError, ValueError) as err:  # no config, no weights, an unknown architecture
        raise ConfigError("model", f"cannot load {args.model} as a reward model: {err}") from err
    if not _is_loopback(args.host):
        print(f"rmkit serve: listening on {args.host}, reachable from other machines"
              + ("" if args.api_key else " WITHOUT an API key"), file=sys.stderr)
    if args.api_key and args.open_route:
        print(f"rmkit serve: {', '.join(args.open_route)} answer(s) WITHOUT the API key (--open-route): anyone who "
              "can reach the port can score; keep it on loopback or a private network", file=sys.stderr)
    outputs = "1 reward" if engine.num_labels == 1 else f"{engine.num_labels} attributes"
    print(f"rmkit serve: {args.model} ({outputs} per input, max length {engine.max_length}) at "
          f"http://{args.host}:{args.port}; API key {'required' if args.api_key else 'not required'}",
          file=sys.stderr, flush=True)
    app = create_app(engine, api_key=args.api_key, max_inputs=args.max_inputs, max_body_bytes=args.max_body_bytes,
                     open_routes=frozenset(args.open_route))
    # uvicorn handles SIGTERM: it stops accepting, finishes in-flight requests, shuts the app down, then
    # re-raises the signal with the handler it found. A no-op handler here makes that a clean exit 0.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=30)
    return 0


def _load_engine(args):
    from rmkit.serve.engine import ScoringEngine

    return ScoringEngine(
        args.model, device=args.device, dtype=args.dtype, max_batch_tokens=args.max_batch_tokens,
        max_batch_size=args.max_batch_size, batch_window_ms=args.batch_window_ms, max_length=args.max_length,
        overlong=args.overlong, normalize=args.normalize, attribute_weights=parse_weights(args.attribute_weights),
    )


def check_host(host: str, port: int) -> None:
    """A ConfigError naming `--host` when the name does not resolve (found before the model loads; an address that
    resolves but is not this machine's fails at bind, exit status 3)."""
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        raise ConfigError("--host", f"cannot resolve {host!r} ({getattr(err, 'strerror', None) or err}); give an "
                                    "address (127.0.0.1, 0.0.0.0, ::) or a name this machine resolves") from None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
