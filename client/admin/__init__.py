"""``trimq-admin``: the mqadmin-like CLI (``python -m client.admin`` works too).

``trimq-admin [-n ADDR] [--json] [--timeout S] COMMAND [options]``. Commands keep mqadmin's
names and flags (``reference/client-and-ecosystem.md`` §1.4) and its column headers; each
lives in one module per family (``topics``, ``groups``, ``cluster``, ``consumer``,
``messages``, ``consume``) and returns a :class:`~client.admin.output.Result`, printed as a
table on a terminal or as one JSON document with ``--json``.

Exit codes: 0 success; 1 a failed operation (one line on stderr naming the cause, no
traceback); 2 usage errors (argparse's own). The name server is ``-n``, else ``NAMESRV_ADDR``,
else ``127.0.0.1:9876``; a lone trimq broker's address works as the name server. With ACL on,
``--access-key``/``--secret-key`` (else ``TRIMQ_ACCESS_KEY``/``TRIMQ_SECRET_KEY``) sign every
request; creating and deleting topics and groups needs an admin account.
"""

from __future__ import annotations

import argparse
import logging
import ssl
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

import anyio
import structlog

from client.admin import cluster, consume, consumer, groups, messages, topics
from client.admin.output import Result
from client.admin.session import Admin, AdminError, describe_broker_error, open_admin
from client.config import ClientConfig, namesrv_from_env
from client.errors import ClientError
from protocol.errors import BrokerError, ProtocolError, TrimqError

__all__ = ["build_parser", "main"]

PROG = "trimq-admin"
Command = Callable[[Admin, argparse.Namespace], Awaitable[Result]]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: global options, then one sub-command per mqadmin command."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Administer trimq (and RocketMQ) brokers, like mqadmin."
    )
    parser.add_argument("-n", "--namesrv", "--namesrvAddr", dest="namesrv", metavar="ADDR",
                        help="name servers 'h1:9876;h2:9876' (default: $NAMESRV_ADDR, "
                        "else 127.0.0.1:9876)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument("--timeout", type=float, default=5.0, metavar="S",
                        help="seconds per request and per connect (default 5)")  # fmt: skip
    parser.add_argument("--access-key", "--accessKey", dest="access_key", metavar="AK",
                        help="ACL account to sign with (default: $TRIMQ_ACCESS_KEY)")  # fmt: skip
    parser.add_argument("--secret-key", "--secretKey", dest="secret_key", metavar="SK",
                        help="its secret (default: $TRIMQ_SECRET_KEY)")  # fmt: skip
    parser.add_argument(
        "--tls", action="store_true", help="TLS, verifying the server (system certificates)"
    )
    parser.add_argument(
        "--tls-ca", metavar="PEM", help="TLS, trusting this certificate (a private CA)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for family in (topics, groups, cluster, consumer, messages, consume):
        family.register(sub)
    return parser


def _quiet_logging() -> bool:
    # The client libraries log through structlog, whose default prints to stdout: that would
    # corrupt --json output. An application (this CLI) may configure logging; do it only if
    # nobody else has, and say so, so that main() can undo it (it may run in-process).
    if structlog.is_configured():
        return False
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    return True


def _sole(exc: BaseException) -> BaseException:
    # Task groups wrap what a command raised in an exception group; one failure is reported
    # as itself (style rule 4: single-exception groups are unwrapped before users see them).
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


async def _run(args: argparse.Namespace, config: ClientConfig) -> Result:
    run: Command = args.run
    try:
        async with open_admin(config) as admin:
            return await run(admin, args)
    except BaseExceptionGroup as group:
        raise _sole(group) from None


def _error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (argparse exits 2 itself on usage errors)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    try:
        namesrv_from_env(args.namesrv)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        config = ClientConfig(
            namesrv_addr=args.namesrv,
            request_timeout=args.timeout,
            connect_timeout=args.timeout,
            # Admin requests are one-shot: a refused connect should fail now, not back off.
            backoff_initial=0.01,
        )
        if args.access_key is not None or args.secret_key is not None:
            config = replace(config, access_key=args.access_key, secret_key=args.secret_key)
        if args.tls_ca is not None:
            context = ssl.create_default_context(cafile=args.tls_ca)
            context.check_hostname = False  # brokers advertise IP addresses
            config = replace(config, tls=context)
        elif args.tls:
            config = replace(config, tls=True)
    except ValueError as exc:  # an access key without its secret, from flags or environment
        parser.error(str(exc))
    except OSError as exc:  # --tls-ca unreadable (ssl.SSLError included)
        parser.error(f"--tls-ca: {exc}")
    configured = _quiet_logging()
    try:
        result = anyio.run(_run, args, config)
    except AdminError as exc:
        return _error(str(exc))
    except (BrokerError, ProtocolError) as exc:
        return _error(describe_broker_error(exc))
    except (ClientError, TrimqError) as exc:
        return _error(str(exc))
    except KeyboardInterrupt:
        return 130
    finally:
        if configured:
            structlog.reset_defaults()
    print(result.render(as_json=args.json))
    return 0
