"""Command-line flags of the simulator, reusable by other front ends.

``python -m lockgate.simulator`` uses :func:`main`; the ``lockgate simulate`` command can
call :func:`build_parser`/:func:`config_from_args` or, with its own flag parser,
:func:`lockgate.simulator.config.load_config` with the same override names.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import orjson
from pydantic import ValidationError

from lockgate.simulator.config import SimulatorConfig, config_error, load_config
from lockgate.simulator.runner import serve

#: flag name -> (config key, type, help)
_RATE_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("--rate-429", "rate_429", "share of requests answered 429 rate_limit_exceeded"),
    ("--rate-500", "rate_500", "share answered 500"),
    ("--rate-503", "rate_503", "share answered 503"),
    ("--rate-timeout", "rate_timeout", "share held open and never answered"),
    ("--rate-broken-body", "rate_broken_body", "share answered 200 with a cut HTTP body"),
    ("--rate-malformed", "rate_malformed", "share answered with cut JSON content"),
    ("--rate-chatty", "rate_chatty", "share answered with prose around fenced JSON"),
)


def _port(text: str) -> int:
    """A TCP port, 0-65535 (0: a free one); an argparse error otherwise (a port beyond
    65535 had been wrapped by the socket layer: 99999 listened on 34463)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0-65535)") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (0-65535; 0 picks a free one)")
    return port


def build_parser(prog: str = "python -m lockgate.simulator") -> argparse.ArgumentParser:
    """The simulator's argument parser (every config knob has a flag)."""
    p = argparse.ArgumentParser(
        prog=prog, description="OpenAI-compatible simulated LLM server for tests and demos.")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8400, help="port; 0 picks a free one")
    p.add_argument("--config", metavar="FILE", help="JSON config file (flags override it)")
    p.add_argument("--config-json", metavar="JSON", help="config as a JSON string")
    p.add_argument("--latency", choices=("fixed", "lognormal"), help="latency distribution")
    p.add_argument("--latency-ms", type=float, help="mean latency in ms (0 = no sleep)")
    p.add_argument("--latency-sigma", type=float, help="lognormal sigma")
    for flag, _key, help_ in _RATE_FLAGS:
        p.add_argument(flag, type=float, help=help_)
    p.add_argument("--retry-after-ms", type=int, help="retry-after-ms of injected 429s")
    p.add_argument("--hang-s", type=float, help="how long a timeout request is held")
    p.add_argument("--rpm", type=int, help="requests per window per API key")
    p.add_argument("--tpm", type=int, help="tokens per window per API key")
    p.add_argument("--window-s", type=float, help="rate-limit window length (default 60)")
    p.add_argument("--enforce-s", type=float,
                   help="also enforce the limits, scaled, in any window of this many seconds "
                        "(e.g. --rpm 60000 --enforce-s 1: 1,000 in any second)")
    p.add_argument("--header-style", choices=("openai", "gateway", "ietf", "anthropic", "none"),
                   help="rate-limit headers: openai (limit, remaining, reset), gateway "
                        "(limit, remaining; no reset), ietf (RateLimit, RateLimit-Policy), "
                        "anthropic (anthropic-ratelimit-*), none (default openai)")
    p.add_argument("--retry-hint", choices=("both", "seconds", "none"),
                   help="retry headers of a 429: retry-after-ms and retry-after, "
                        "retry-after only, or none (default both)")
    p.add_argument("--no-limit-headers-on-429", dest="limit_headers_on_429",
                   action="store_false", default=None,
                   help="a 429 without the rate-limit headers (as many gateways send it)")
    p.add_argument("--quota-exhausted", action="store_true", default=None,
                   help="answer every request 429 insufficient_quota")
    p.add_argument("--max-in-flight", type=int,
                   help="requests worked on at once; one more is refused with a 429 "
                        "naming no limit (a concurrency limit)")
    p.add_argument("--context-window", type=int, help="max prompt tokens")
    p.add_argument("--accuracy-noise", type=float, help="share of rule labels flipped")
    p.add_argument("--strict-models", action="store_true", default=None,
                   help="404 for models not in the config's list")
    p.add_argument("--require-api-key", action="store_true", default=None,
                   help="401 without 'Authorization: Bearer KEY'")
    p.add_argument("--seed", type=int, help="seed of fault, latency and degradation draws")
    p.add_argument("--degrade", metavar="JSON",
                   help='degradation switches per model, e.g. \'{"sim-x": {"drop_fields": 0.3}}\'')
    p.add_argument("--exit-with-parent", action="store_true",
                   help="stop when the parent process exits")
    p.add_argument("--log-level", default="WARNING", help="log level (stderr)")
    return p


def config_from_args(args: argparse.Namespace) -> SimulatorConfig:
    """Resolve file, JSON string and flags (in that order of precedence, lowest first)."""
    overrides: dict[str, Any] = {}
    if args.config_json:
        doc = orjson.loads(args.config_json)
        if not isinstance(doc, dict):
            raise ValueError("--config-json must be a JSON object")
        overrides.update(doc)
    if args.degrade:
        degrade = orjson.loads(args.degrade)
        if not isinstance(degrade, dict):
            raise ValueError("--degrade must be a JSON object of model -> switches")
        overrides["degrade"] = degrade
    latency: dict[str, Any] = {}
    if args.latency is not None:
        latency["kind"] = args.latency
    if args.latency_ms is not None:
        latency["mean_ms"] = args.latency_ms
    if args.latency_sigma is not None:
        latency["sigma"] = args.latency_sigma
    if latency:
        base = overrides.get("latency")
        if isinstance(base, int | float):
            base = {"kind": "fixed", "mean_ms": float(base)}
        overrides["latency"] = {**(base or {}), **latency}
    keys = [key for _flag, key, _help in _RATE_FLAGS] + [
        "retry_after_ms", "hang_s", "rpm", "tpm", "window_s", "enforce_s", "header_style",
        "retry_hint", "limit_headers_on_429", "max_in_flight", "quota_exhausted",
        "context_window", "accuracy_noise", "strict_models", "require_api_key", "seed"]
    for key in keys:
        value = getattr(args, key)
        if value is not None:
            overrides[key] = value
    return load_config(args.config, overrides)


def main(argv: Sequence[str] | None = None, prog: str = "python -m lockgate.simulator") -> int:
    """Parse flags, then serve until SIGTERM/SIGINT (``prog`` names the command in help)."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
    except ValidationError as exc:
        parser.error(f"invalid configuration: {config_error(exc)}")
    except (ValueError, OSError) as exc:
        parser.error(f"invalid configuration: {exc}")
    try:
        serve(config, args.host, args.port,
              parent_pid=os.getppid() if args.exit_with_parent else None)
    except OSError as exc:
        why = (exc.strerror or str(exc)).lower()
        if exc.errno == errno.EADDRINUSE:
            why = ("something listens there already; stop it, or pass --port 0 for any "
                   "free port")
        print(f"error: the simulator cannot listen on {args.host}:{args.port}: {why}",
              file=sys.stderr)
        return 2
    return 0
