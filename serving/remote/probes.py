"""Which commands ``fleet exec`` may run: read-only probes, decided per program *and* argument shape — pure.

An allow-list of programs is not enough when the same program reads or writes by its arguments (``hostname``
prints the name, ``hostname NAME`` sets it; ``date`` versus ``date MMDDhhmm``; ``ip addr show`` versus
``ip -b FILE``). :data:`READ_ONLY_PROBES` gives each program the shapes in which it only reads and
:func:`check_read_only` refuses everything else, naming the program, the argument and the rule.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field


class FanoutError(ValueError):
    """The command is not a read-only probe (message names the program and the rule)."""


@dataclass(frozen=True)
class Shape:
    """The arguments one read-only probe may be given. Anything not listed is refused, so an option this table
    does not know (it could be one that writes) never runs.

    Options are ``flags`` (no value), ``valued`` (``-i 0`` or ``--id=0``; ``limits`` checks some values) and
    ``cluster`` letters that may be combined (``ss -tlnp``). With ``commands``, the first operand names a sub-command, checked against its own
    shape (``ip link show``, ``chronyc tracking``); ``bare`` says whether it may be left out. Without, every
    operand goes through ``operand`` (a reason to refuse it, or None), at most ``max_operands`` of them.
    """

    flags: frozenset[str] = frozenset()
    valued: frozenset[str] = frozenset()
    limits: Mapping[str, Callable[[str], str | None]] = field(default_factory=dict)
    cluster: str = ""
    commands: Mapping[str, Shape] | None = None
    bare: bool = True
    operand: Callable[[str], str | None] | None = None
    max_operands: int | None = None
    anything: bool = False  # the program has no argument that writes


def _any(_arg: str) -> str | None:
    return None


_ANY = Shape(anything=True)
_PROC_ESCAPES = frozenset({"root", "cwd", "fd", "map_files", "exe", "mem", "kcore", "kmsg", "environ"})
_ETC_SECRETS = frozenset({"shadow", "shadow-", "gshadow", "gshadow-", "sudoers", "ssh", "ssl"})


def _readable_file(path: str) -> str | None:
    """``cat`` reads only kernel and system state: an absolute, normalised path under /proc, /sys or /etc.
    Opening a device can act (closing /dev/watchdog unexpectedly reboots the node; reading /proc/kmsg consumes
    the kernel log), so /dev, /proc's links into other trees and secrets (/etc/shadow, keys) are refused."""
    parts = path.split("/")
    if not path.startswith("/") or posixpath.normpath(path) != path:
        return "give an absolute path without '..' (a relative path could reach /dev)"
    if parts[1] not in {"proc", "sys", "etc"}:
        return "cat reads under /proc, /sys and /etc only (opening a device such as /dev/watchdog acts on the node)"
    if parts[1] == "proc" and _PROC_ESCAPES & set(parts[2:]):
        return f"{path} leads out of /proc or consumes what it reads ({', '.join(sorted(_PROC_ESCAPES))})"
    if parts[1] == "etc" and len(parts) > 2 and parts[2] in _ETC_SECRETS:
        return f"{path} holds secrets; fleet exec never prints them"
    return None


def _clock_format(arg: str) -> str | None:
    return None if arg.startswith("+") else "date MMDDhhmm[[CC]YY] sets the clock; give +FORMAT to read it"


def _no_hostname(_arg: str) -> str:
    return "hostname NAME sets the host name"


PING_MIN_INTERVAL_S = 0.2  # ping's own floor for unprivileged users; faster is a flood


def _ping_interval(value: str) -> str | None:
    try:
        ok = float(value) >= PING_MIN_INTERVAL_S
    except ValueError:
        ok = False
    return None if ok else f"an interval under {PING_MIN_INTERVAL_S} s floods the network"


_NVSMI_QUERIES = frozenset(
    {
        "-i",
        "--id",
        "-d",
        "--display",
        "-l",
        "--loop",
        "-lms",
        "--loop-ms",
        "--format",
        "--query-gpu",
        "--query-compute-apps",
        "--query-accounted-apps",
        "--query-retired-pages",
        "--query-remapped-rows",
        "--query-supported-clocks",
    }
)
_IP_OBJECT = Shape(commands={"show": _ANY, "list": _ANY, "get": _ANY})  # after the verb: filters only
_IP_OBJECTS = ("link", "l", "address", "addr", "a", "route", "r", "neighbour", "neighbor", "neigh", "n", "rule")
_CHRONYC_REPORTS = ("tracking", "sources", "sourcestats", "activity", "ntpdata", "serverstats", "rtcdata")
_TIMEDATECTL_SHOW = Shape(
    flags=frozenset({"--no-pager", "-a", "--all", "--value"}), valued=frozenset({"-p", "--property"})
)

# Every program fleet exec runs, with the argument shapes in which it only reads. Programs that can write
# are limited to their reading forms; the others (marked _ANY) have no option or operand that changes the node.
READ_ONLY_PROBES: Mapping[str, Shape] = {
    "nvidia-smi": Shape(
        # -f/--filename writes a file; -r, -pm, -pl, -c, -e, -ac, -lgc, -mig, -p … change the GPU.
        flags=frozenset({"-L", "--list-gpus", "-q", "--query", "-x", "--xml-format", "-u", "--unit", "-h", "--help"}),
        valued=_NVSMI_QUERIES,
        commands={
            "topo": Shape(
                flags=frozenset({"-m", "--matrix", "-mp", "--matrixpciinfo"}), valued=frozenset({"-i", "-p2p"})
            ),
            "nvlink": Shape(
                flags=frozenset({"-s", "--status", "-c", "--capabilities", "-e", "--errorcounters"}),
                valued=frozenset({"-i", "--id"}),
            ),
            "mig": Shape(flags=frozenset({"-lgi", "-lgip", "-lci", "-lcip"}), valued=frozenset({"-i", "--id", "-gi"})),
            "dmon": Shape(valued=frozenset({"-i", "-s", "-d", "-c", "-o"})),  # -f writes a file
            "pmon": Shape(valued=frozenset({"-i", "-s", "-d", "-c", "-o"})),
        },
    ),
    "ibstat": _ANY,
    "ibstatus": _ANY,
    "ibv_devinfo": _ANY,
    "chronyc": Shape(
        # getopt "+": options end at the command; -m (several commands) is refused, so only one report runs.
        flags=frozenset({"-n", "-c", "-4", "-6", "-N"}),
        valued=frozenset({"-h", "-p"}),
        commands=dict.fromkeys(_CHRONYC_REPORTS, _ANY),
        bare=False,  # no command: interactive mode
    ),
    "timedatectl": Shape(
        flags=_TIMEDATECTL_SHOW.flags,
        valued=_TIMEDATECTL_SHOW.valued,
        commands=dict.fromkeys(
            ("status", "show", "show-timesync", "timesync-status", "list-timezones"), _TIMEDATECTL_SHOW
        ),
    ),
    "uptime": _ANY,
    "uname": _ANY,
    "hostname": Shape(
        # -F/--file, -b/--boot and an operand set the name; -y/--nis with an operand sets the NIS domain.
        flags=frozenset(
            {
                "-s",
                "--short",
                "-f",
                "--fqdn",
                "--long",
                "-d",
                "--domain",
                "-i",
                "--ip-address",
                "-I",
                "--all-ip-addresses",
                "-A",
                "--all-fqdns",
                "-a",
                "--alias",
            }
        ),
        operand=_no_hostname,
    ),
    "date": Shape(
        # -s/--set and an MMDDhhmm operand set the clock.
        flags=frozenset({"-u", "--utc", "--universal", "-R", "--rfc-email", "-I", "--iso-8601"}),
        valued=frozenset({"-d", "--date", "-r", "--reference", "--rfc-3339"}),
        operand=_clock_format,
        max_operands=1,
    ),
    "cat": Shape(cluster="nAbEsTv", operand=_readable_file),
    "ls": _ANY,
    "stat": _ANY,
    "df": _ANY,
    "free": _ANY,
    "findmnt": _ANY,
    "lsblk": _ANY,
    "nproc": _ANY,
    "ip": Shape(
        # -b/-batch FILE runs the file's commands and -force keeps going; the verbs add/del/set/flush/… and
        # `netns exec` are refused: only show, list and get (no abbreviations: `ip r a` is `route add`).
        flags=frozenset(
            {
                "-4",
                "-6",
                "-s",
                "-stats",
                "-d",
                "-details",
                "-j",
                "-json",
                "-p",
                "-pretty",
                "-br",
                "-brief",
                "-o",
                "-oneline",
                "-c",
                "-color",
                "-h",
                "-human",
                "-r",
                "-resolve",
                "-a",
                "-all",
            }
        ),
        valued=frozenset({"-n", "-netns", "-f", "-family"}),
        commands={**dict.fromkeys(_IP_OBJECTS, _IP_OBJECT), "netns": Shape(commands={"list": _ANY, "identify": _ANY})},
        bare=False,
    ),
    "ss": Shape(
        # -K/--kill closes sockets; -D/--diag FILE writes a file.
        cluster="hVHOnraloempTisZzb460tSudwxM",
        flags=frozenset(
            {
                "--numeric",
                "--resolve",
                "--all",
                "--listening",
                "--options",
                "--extended",
                "--memory",
                "--processes",
                "--info",
                "--summary",
                "--tcp",
                "--udp",
                "--unix",
                "--raw",
                "--ipv4",
                "--ipv6",
                "--no-header",
                "--oneline",
                "--threads",
            }
        ),
        valued=frozenset({"-f", "--family", "-A", "--query", "--socket", "-N", "--net", "-F", "--filter"}),
        operand=_any,  # a filter expression (state established '( dport = :22 )') only selects
    ),
    "ping": Shape(
        # -f floods and -l preloads a burst: refused; so is an -i interval under 0.2 s.
        flags=frozenset({"-n", "-q", "-4", "-6", "-D", "-O", "-v"}),
        valued=frozenset({"-c", "-W", "-w", "-s", "-t", "-I", "-i"}),
        limits={"-i": _ping_interval},
        operand=_any,
        max_operands=1,
    ),
    "nvidia-container-cli": Shape(
        # no global option: -k/--load-kmods loads kernel modules, -d/--debug FILE writes a log, configure mounts.
        commands={
            "info": Shape(flags=frozenset({"-c", "--csv"})),
            "list": Shape(flags=frozenset({"-d", "--device", "-l", "--libraries", "-b", "--binaries", "-i", "--ipcs"})),
        },
        bare=False,
    ),
    "true": _ANY,
    "echo": _ANY,
}
_FIX = "Make changes with the Ansible roles (ansible/site.yml)."


def check_read_only(argv: Sequence[str]) -> str:
    """Return the remote command line for ``argv`` or raise :class:`FanoutError` if it can write: the program
    must be in :data:`READ_ONLY_PROBES` and every argument must fit its read-only :class:`Shape`."""
    if not argv:
        raise FanoutError("no command given; put the probe after '--', e.g. -- nvidia-smi -L")
    program = argv[0]
    shape = READ_ONLY_PROBES.get(program)
    if shape is None:
        raise FanoutError(
            f"command {program!r} is not a read-only probe; fleet exec runs only "
            f"{', '.join(sorted(READ_ONLY_PROBES))}. {_FIX}"
        )
    _check_shape(program, shape, argv[1:])
    return shlex.join(argv)


def _is_cluster(arg: str, letters: str) -> bool:
    return bool(letters) and not arg.startswith("--") and all(c in letters for c in arg[1:])


def _check_shape(command: str, shape: Shape, args: Sequence[str]) -> None:
    if shape.anything:
        return
    operands: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            operands.extend(args[i + 1 :])
            break
        if arg.startswith("-") and arg != "-":
            name, eq, _ = arg.partition("=")
            if name in shape.valued:
                value = arg[len(name) + 1 :] if eq else args[i + 1] if i + 1 < len(args) else None
                if value is None:
                    raise FanoutError(f"{command} {arg} needs a value")
                reason = shape.limits[name](value) if name in shape.limits else None
                if reason is not None:
                    raise FanoutError(f"{command} {name} {value}: refused, {reason}. {_FIX}")
                i += 1 if eq else 2
                continue
            if arg not in shape.flags and not _is_cluster(arg, shape.cluster):
                raise FanoutError(
                    f"{command} {arg}: not a read-only option of {command} (it may write, or is not known to only "
                    f"read); fleet exec only reads. {_FIX}"
                )
            i += 1
            continue
        if shape.commands is not None:
            sub = shape.commands.get(arg)
            if sub is None:
                raise FanoutError(
                    f"{command} {arg}: not a read-only sub-command; fleet exec runs {command} "
                    f"{', '.join(sorted(shape.commands))} only. {_FIX}"
                )
            _check_shape(f"{command} {arg}", sub, args[i + 1 :])
            return
        operands.append(arg)
        i += 1
    if shape.commands is not None and not shape.bare:
        raise FanoutError(f"{command} needs a sub-command, one of {', '.join(sorted(shape.commands))}")
    if shape.max_operands is not None and len(operands) > shape.max_operands:
        raise FanoutError(f"{command} {' '.join(operands)}: at most {shape.max_operands} operand(s) in a probe")
    for operand in operands:
        reason = "it takes no operand in a probe" if shape.operand is None else shape.operand(operand)
        if reason is not None:
            raise FanoutError(f"{command} {operand}: refused, {reason}. {_FIX}")
