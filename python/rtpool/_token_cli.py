"""``rtpool token``: create, list and revoke per-user tokens, and set users' quotas.

The store is the data dir's ``rtpool.db`` (SQLite) unless ``--store`` names another one; a
running master sees changes at once (it looks tokens up on every handshake).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable, Dict, List

__all__ = ["add_arguments", "run"]

_TOKEN_HELP = """\
Manage per-user tokens and compute-time quotas. A user has any number of client and worker
tokens and one quota of execution seconds (unlimited unless set). Only each token's SHA-256
is stored: a token is shown once, when it is created.

examples:
  RTPOOL_TOKEN=$(rtpool token create --user alice --role client --quota-seconds 3600)
  rtpool token list
  rtpool token revoke 3f9a2c
  rtpool token quota --user alice --quota-seconds 7200
  rtpool token quota --user alice --unlimited
  rtpool token set --user alice --max-priority 5

A revoked token's open sessions are closed within about a second. A client asking for a
priority above its user's ceiling is refused with an error naming the ceiling.
"""

_STORE_HELP = (
    "store URL: sqlite (the data dir's rtpool.db, default), sqlite:///abs/path.db or "
    "postgres://user@host:port/db"
)


def _priority(text: str) -> int:
    """A priority as the protocol carries it (a signed 32-bit integer)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not -(2**31) <= value < 2**31:
        raise argparse.ArgumentTypeError(f"{value} is out of range: use -2147483648..2147483647")
    return value


def add_arguments(parser: argparse.ArgumentParser, default_data_dir: Callable[[], str]) -> None:
    """Add the ``token`` verbs to ``parser`` (the ``rtpool token`` subparser).

    Args:
        parser: The subparser to fill.
        default_data_dir: Returns the data dir used when ``--data-dir`` is not given (the same
            as ``rtpool master``'s).
    """
    parser.description = _TOKEN_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    verbs = parser.add_subparsers(dest="token_command", metavar="VERB")
    verbs.required = True

    def verb(name: str, help: str) -> argparse.ArgumentParser:
        p = verbs.add_parser(name, help=help, description=help)
        p.add_argument(
            "--data-dir",
            default=None,
            metavar="DIR",
            help="the master's data dir (default: $RTPOOL_DATA_DIR or ~/.local/share/rtpool)",
        )
        p.add_argument("--store", default=None, metavar="URL", help=_STORE_HELP)
        p.set_defaults(default_data_dir=default_data_dir)
        return p

    create = verb("create", "create a token and print it (once: it cannot be shown again)")
    create.add_argument("--user", required=True, help="the user the token acts for")
    create.add_argument(
        "--role",
        required=True,
        choices=["client", "worker"],
        help="client: submits packages (RTPOOL_TOKEN of programs using rtpool.Client); worker: "
        "runs tasks (RTPOOL_WORKER_TOKEN of `rtpool worker`)",
    )
    create.add_argument(
        "--quota-seconds",
        type=float,
        default=None,
        metavar="S",
        help="also set the user's quota of execution seconds",
    )
    create.add_argument(
        "--max-priority",
        type=_priority,
        default=None,
        metavar="N",
        help="also set the user's priority ceiling (packages above it are refused)",
    )
    verb(
        "list",
        "list tokens (id, user, role, created, revoked) with each user's quota and priority "
        "ceiling",
    )
    revoke = verb("revoke", "revoke a token: it no longer connects")
    revoke.add_argument("id", metavar="ID", help="token id, or a unique prefix of 6+ chars")
    quota = verb("quota", "set a user's quota of execution seconds")
    quota.add_argument("--user", required=True, help="the user whose quota to set")
    amount = quota.add_mutually_exclusive_group(required=True)
    amount.add_argument(
        "--quota-seconds",
        type=float,
        metavar="S",
        help="quota of execution seconds (as `create --quota-seconds`)",
    )
    # The spelling of earlier versions, kept working but no longer shown.
    amount.add_argument("--seconds", type=float, dest="quota_seconds", help=argparse.SUPPRESS)
    amount.add_argument("--unlimited", action="store_true", help="remove the quota")
    setter = verb("set", "set a user's priority ceiling")
    setter.add_argument("--user", required=True)
    ceiling = setter.add_mutually_exclusive_group(required=True)
    ceiling.add_argument(
        "--max-priority", type=_priority, metavar="N", help="highest priority the user may ask for"
    )
    ceiling.add_argument(
        "--no-max-priority", action="store_true", help="remove the user's priority ceiling"
    )


def run(args: argparse.Namespace) -> int:
    """Run one ``rtpool token`` verb.

    Args:
        args: Parsed arguments from a parser set up by :func:`add_arguments`.

    Returns:
        The exit code: 0, or 1 after printing the error to stderr.
    """
    from . import _native
    from .errors import RtpoolError

    data_dir = args.data_dir or args.default_data_dir()
    store = args.store
    if args.token_command in ("list", "revoke"):
        # Reading must not create a data dir and an empty store where none was.
        problem = _missing_store(data_dir, store)
        if problem:
            print(f"rtpool token {args.token_command}: {problem}", file=sys.stderr)
            return 1
    try:
        if args.token_command == "create":
            token, info = _native.token_create(
                data_dir,
                args.user,
                args.role,
                args.quota_seconds,
                store=store,
                max_priority=args.max_priority,
            )
            # stdout carries the token alone, so `$(rtpool token create ...)` captures it.
            print(token)
            sys.stdout.flush()
            print(
                f"created {info['role']} token {info['id']} for user {info['user']}; "
                "store it now: it is not kept and cannot be shown again "
                f"(revoke with `rtpool token revoke {info['id']}`)",
                file=sys.stderr,
            )
        elif args.token_command == "list":
            tokens = _native.token_list(data_dir, store=store)
            quotas = {q["user"]: q for q in _native.token_quotas(data_dir, store=store)}
            print(format_table(tokens, quotas))
        elif args.token_command == "revoke":
            revoked = _already_revoked(_native.token_list(data_dir, store=store), args.id)
            if revoked is not None:
                print(
                    f"rtpool token revoke: {revoked['role']} token {revoked['id']} of user "
                    f"{revoked['user']} was already revoked; nothing to do",
                    file=sys.stderr,
                )
                return 1
            info = _native.token_revoke(data_dir, args.id, store=store)
            print(f"revoked {info['role']} token {info['id']} of user {info['user']}")
        elif args.token_command == "quota":
            seconds = None if args.unlimited else args.quota_seconds
            _native.token_set_quota(data_dir, args.user, seconds, store=store)
            what = "unlimited" if seconds is None else _seconds(round(seconds * 1e6))
            print(f"quota of user {args.user}: {what}")
        elif args.token_command == "set":
            ceiling = None if args.no_max_priority else args.max_priority
            _native.token_set_max_priority(data_dir, args.user, ceiling, store=store)
            what = "none" if ceiling is None else str(ceiling)
            print(f"priority ceiling of user {args.user}: {what}")
        else:
            raise AssertionError(args.token_command)
    except RtpoolError as exc:
        print(f"rtpool token {args.token_command}: {exc}", file=sys.stderr)
        return 1
    return 0


def _seconds(us: int | None) -> str:
    """Microseconds as people read them: ``unlimited``, ``3,600 s``, ``1.5 s``, ``0.012 s``,
    ``1 µs`` (never ``1e-06 s``)."""
    if us is None:
        return "unlimited"
    if us == 0 or us >= 1000:
        return f"{us / 1e6:,.3f}".rstrip("0").rstrip(".") + " s"
    return f"{us} µs"


def _missing_store(data_dir: str, store: str | None) -> str | None:
    """Why the SQLite store to read does not exist (None: it does, or it is PostgreSQL)."""
    if store is None:
        path = os.path.join(data_dir, "rtpool.db")
    elif store.startswith("sqlite:///"):
        path = store[len("sqlite://") :]
    else:
        return None
    if os.path.exists(path):
        return None
    where = (
        f"the data dir {data_dir} does not exist"
        if store is None and not os.path.isdir(data_dir)
        else f"there is no user store {path}"
    )
    return (
        f"{where}: no token was ever created there. Pass the master's --data-dir (it prints "
        "it on first start) or --store; `rtpool token create` makes the store"
    )


def _already_revoked(tokens: List[Dict], prefix: str) -> Dict | None:
    """The token ``prefix`` names if it is the only match and is revoked, else None (the
    native call reports unknown and ambiguous prefixes)."""
    matches = [t for t in tokens if t["id"].startswith(prefix)]
    if len(matches) == 1 and matches[0]["revoked"]:
        return matches[0]
    return None


def _align(rows: List[tuple]) -> List[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]


#: The user of the master's built-in tokens (the data dir's client.token and worker.token).
_BUILTIN_USER = "default"


def _user_label(user: str) -> str:
    if user == _BUILTIN_USER:
        return f"{user} (built-in tokens)"
    return user


def format_table(tokens: List[Dict], quotas: Dict[str, Dict]) -> str:
    """Render tokens as an aligned table with their user's quota and usage, then the users
    that have a quota or usage but no token.

    Args:
        tokens: Dicts from ``_native.token_list``.
        quotas: ``_native.token_quotas`` dicts by user name.

    Returns:
        The text, one token per line after a header; a note when there are no tokens.
    """
    lines = []
    if tokens:
        rows = [("ID", "USER", "ROLE", "CREATED (UTC)", "REVOKED", "QUOTA", "USED", "MAX PRIO")]
        for t in tokens:
            q = quotas.get(t["user"], {"quota_us": None, "used_us": 0})
            prio = q.get("max_priority")
            created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t["created_unix"]))
            revoked = "yes" if t["revoked"] else "no"
            quota, used = _seconds(q["quota_us"]), _seconds(q["used_us"])
            prio_text = "-" if prio is None else str(prio)
            rows.append((t["id"], t["user"], t["role"], created, revoked, quota, used, prio_text))
        lines += _align(rows)
    else:
        lines.append("no tokens; create one with `rtpool token create --user U --role client`")
    with_tokens = {t["user"] for t in tokens}
    others = [q for user, q in sorted(quotas.items()) if user not in with_tokens]
    if others:
        lines += ["", "users without tokens in this store:"]
        rows = [("USER", "QUOTA", "USED")]
        rows += [
            (_user_label(q["user"]), _seconds(q["quota_us"]), _seconds(q["used_us"]))
            for q in others
        ]
        lines += _align(rows)
    return "\n".join(lines)
