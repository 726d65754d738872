"""The read-only guard of `fleet exec` (serving/remote/probes.py), pure: every allowed program in the forms that
only read, and each of its forms that writes, refused with the program, the argument and the rule named."""

from __future__ import annotations

import re
import shlex

import pytest

from serving.remote.probes import READ_ONLY_PROBES, FanoutError, check_read_only

# Every program fleet exec runs: forms that only read (must pass), and the forms of the same program that change
# the node, write a file, act on a device, flood the network or print secrets (each must be refused). Programs with
# an empty second list have no such form; that claim is reviewed here, program by program.
PROBE_FORMS: dict[str, tuple[list[list[str]], list[list[str]]]] = {
    "nvidia-smi": (
        [[], ["-L"], ["-q", "-d", "MEMORY"], ["--query-gpu=index,name,memory.total,memory.used", "--format=csv"],
         ["-i", "0", "-q"], ["topo", "-m"], ["nvlink", "-s"], ["mig", "-lgi"], ["dmon", "-s", "pucm", "-c", "1"]],
        [["-r"], ["--gpu-reset", "-i", "0"], ["-pm", "1"], ["-pl", "300"], ["-c", "3"], ["-e", "0"], ["-p", "0"],
         ["-ac", "1215,1410"], ["-rac"], ["-lgc", "1000,1500"], ["-rgc"], ["-mig", "1"],
         ["--query-gpu=index", "--format=csv", "-f", "/etc/motd"], ["--filename=/etc/motd", "-q"],
         ["mig", "-cgi", "9", "-C"], ["mig", "-dgi"], ["nvlink", "-r", "0"], ["nvlink", "-sc", "0bz"],
         ["dmon", "-f", "/etc/motd"], ["clocks", "--lock-gpu", "1000"], ["--query-gpu=index", "-r"]],
    ),
    "ibstat": ([[], ["-l"], ["mlx5_0", "1"]], []),
    "ibstatus": ([[], ["mlx5_0"]], []),
    "ibv_devinfo": ([[], ["-v"], ["-d", "mlx5_0"]], []),
    "chronyc": (
        [["tracking"], ["-n", "sources", "-v"], ["-c", "sourcestats"], ["activity"], ["-h", "/run/chrony/chronyd.sock", "tracking"]],
        [[], ["makestep"], ["settime", "12:00"], ["burst", "4/4"], ["offline"], ["online"], ["local", "stratum", "10"],
         ["reload", "sources"], ["shutdown"], ["add", "server", "10.0.0.1"], ["delete", "10.0.0.1"], ["dump"],
         ["writertc"], ["trimrtc"], ["reselect"], ["reset", "sources"], ["-m", "tracking", "makestep"],
         ["-n", "makestep"], ["maxdelay", "10.0.0.1", "0.1"], ["allow", "all"], ["cyclelogs"]],
    ),
    "timedatectl": (
        [[], ["status"], ["show", "-p", "NTPSynchronized", "--value"], ["show-timesync", "--all"], ["timesync-status"]],
        [["set-time", "2026-01-01 00:00"], ["set-timezone", "UTC"], ["set-ntp", "false"], ["set-local-rtc", "1"],
         ["ntp-servers", "eth0", "10.0.0.1"], ["revert", "eth0"], ["-H", "other-node", "set-ntp", "true"]],
    ),
    "uptime": ([[], ["-p"]], []),
    "uname": ([[], ["-a"], ["-r"]], []),
    "hostname": (
        [[], ["-s"], ["-f"], ["-I"]],
        [["node99"], ["-F", "/etc/hostname"], ["--file", "/etc/hostname"], ["--file=/etc/hostname"], ["-b", "node99"],
         ["--boot"], ["-y", "nisdomain"], ["-s", "node99"]],
    ),
    "date": (
        [[], ["+%s"], ["--", "+%s"], ["-u", "--", "+%s"], ["-u", "+%FT%TZ"], ["-R"], ["-d", "@0", "+%s"], ["-r", "/etc/hostname"]],
        [["0101120026"], ["MMDDhhmm"], ["-u", "010112002026"], ["-s", "2026-01-01"], ["--set=2026-01-01"],
         ["--set", "2026-01-01"], ["+%s", "0101120026"], ["--", "0101120026"]],
    ),
    "cat": (
        [["/proc/loadavg"], ["/proc/meminfo", "/proc/cpuinfo"], ["-A", "/etc/os-release"], ["/sys/class/infiniband/mlx5_0/ports/1/rate"],
         ["/proc/1/status"], ["/etc"]],
        [["/dev/watchdog"], ["/dev/sda"], ["../../dev/watchdog"], ["/proc/../dev/watchdog"], ["/proc/1/root/dev/watchdog"],
         ["/proc/self/fd/0"], ["/proc/kmsg"], ["/proc/1/environ"], ["/etc/shadow"], ["/etc/ssh/ssh_host_ed25519_key"],
         ["/root/.ssh/id_ed25519"], ["proc/loadavg"]],
    ),
    "ls": ([[], ["-la", "/etc"], ["/sys/class/infiniband"]], []),
    "stat": ([["/etc/hostname"], ["-f", "/"]], []),
    "df": ([[], ["-h", "/"], ["-i"]], []),
    "free": ([[], ["-g"]], []),
    "findmnt": ([[], ["-n", "-o", "FSTYPE", "/sys/fs/cgroup"]], []),
    "lsblk": ([[], ["-J"]], []),
    "nproc": ([[], ["--all"]], []),
    "ip": (
        [["addr"], ["-br", "addr", "show"], ["-j", "link", "show", "dev", "eth0"], ["route", "get", "10.0.0.1"],
         ["-s", "link"], ["-n", "ns1", "route", "show", "table", "main"], ["neigh", "show"], ["rule", "list"],
         ["netns", "list"]],
        [[], ["-b", "/tmp/cmds"], ["-batch", "/tmp/cmds"], ["-force", "-b", "/tmp/cmds"], ["link", "set", "eth0", "down"],
         ["addr", "add", "10.0.0.9/24", "dev", "eth0"], ["route", "del", "default"], ["addr", "flush", "dev", "eth0"],
         ["neigh", "replace", "10.0.0.1", "lladdr", "0:0:0:0:0:1", "dev", "eth0"], ["r", "a", "10.0.0.0/8", "via", "10.0.0.1"],
         ["link", "s", "eth0", "up"], ["netns", "add", "x"], ["netns", "exec", "x", "reboot"], ["link", "add", "br0", "type", "bridge"],
         ["monitor"], ["xfrm", "state", "flush"]],
    ),
    "ss": (
        [[], ["-tlnp"], ["-s"], ["--tcp", "--listening"], ["-tn", "state", "established", "( dport = :22 )"], ["-A", "tcp", "-n"]],
        [["-K", "dst", "10.0.0.1"], ["--kill", "dst", "10.0.0.1"], ["-tK"], ["-D", "/tmp/x"], ["--diag=/tmp/x"], ["-tnD", "/tmp/x"]],
    ),
    "ping": (
        [["-c", "3", "10.0.0.2"], ["-c", "1", "-W", "1", "-q", "node02"], ["-c", "3", "-i", "0.2", "127.0.0.1"]],
        [["-f", "10.0.0.2"], ["-l", "100", "10.0.0.2"], ["-i=0.01", "10.0.0.2"], ["-i", "0.001", "10.0.0.2"], ["-i", "fast", "10.0.0.2"],
         ["-c", "1", "10.0.0.2", "10.0.0.3"]],
    ),
    "nvidia-container-cli": (
        [["info"], ["info", "--csv"], ["list", "--binaries"]],
        [[], ["configure", "--device=all", "/rootfs"], ["-k", "info"], ["--load-kmods", "list"], ["-d", "/tmp/log", "info"],
         ["--debug=/tmp/log", "info"], ["--ldconfig=@/sbin/ldconfig", "list"]],
    ),
    "true": ([[]], []),
    "echo": ([["x; reboot"], ["-n", "x"]], []),
}  # fmt: skip


def test_every_allowed_program_has_its_forms_listed() -> None:
    assert set(PROBE_FORMS) == set(READ_ONLY_PROBES)


@pytest.mark.parametrize(
    "argv", [[program, *args] for program, (reads, _) in PROBE_FORMS.items() for args in reads], ids=shlex.join
)
def test_reading_forms_run(argv: list[str]) -> None:
    assert check_read_only(argv) == shlex.join(argv)


@pytest.mark.parametrize(
    "argv", [[program, *args] for program, (_, writes) in PROBE_FORMS.items() for args in writes], ids=shlex.join
)
def test_forms_that_change_the_node_are_refused(argv: list[str]) -> None:
    with pytest.raises(FanoutError, match=r"Ansible roles|needs a sub-command|at most 1 operand") as err:
        check_read_only(argv)
    assert argv[0] in str(err.value)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "no command given; put the probe after '--', e.g. -- nvidia-smi -L"),
        (["reboot"], "command 'reboot' is not a read-only probe; fleet exec runs only cat, chronyc, date, df, echo, findmnt, free, hostname, ibstat, ibstatus, ibv_devinfo, ip, ls, lsblk, nproc, nvidia-container-cli, nvidia-smi, ping, ss, stat, timedatectl, true, uname, uptime. Make changes with the Ansible roles (ansible/site.yml)."),
        (["ss", "--kill"], "ss --kill: not a read-only option of ss"),
        (["rm", "-rf", "/"], "'rm' is not a read-only probe"),
        (["nvidia-smi", "-r"], "nvidia-smi -r: not a read-only option of nvidia-smi"),
        (["ip", "link", "set", "eth0", "down"], "ip link set: not a read-only sub-command; fleet exec runs ip link get, list, show only"),
        (["ip", "-b", "cmds"], "ip -b: not a read-only option"),
        (["chronyc", "makestep"], "chronyc makestep: not a read-only sub-command"),
        (["hostname", "node99"], "hostname node99: refused, hostname NAME sets the host name"),
        (["date", "0101120026"], "date 0101120026: refused, date MMDDhhmm"),
        (["cat", "/dev/watchdog"], "cat /dev/watchdog: refused, cat reads under /proc, /sys and /etc only"),
        (["cat", "proc/loadavg"], "cat proc/loadavg: refused, give an absolute path without '..' (a relative path could reach /dev)"),
        (["cat", "/proc/1/root/x"], "/proc/1/root/x leads out of /proc or consumes what it reads (cwd, environ, exe, fd, kcore, kmsg, map_files, mem, root)"),
        (["cat", "/etc/shadow"], "cat /etc/shadow: refused, /etc/shadow holds secrets; fleet exec never prints them. Make changes"),
        (["ip", "link", "set"], "ip link set: not a read-only sub-command; fleet exec runs ip link get, list, show only. Make changes with the Ansible roles (ansible/site.yml)."),
        (["nvidia-smi", "-pm", "1"], "nvidia-smi -pm: not a read-only option of nvidia-smi (it may write, or is not known to only read); fleet exec only reads. Make changes with the Ansible roles (ansible/site.yml)."),
        (["date", "+%s", "+%F"], "date +%s +%F: at most 1 operand(s) in a probe"),
        (["timedatectl", "show", "NTP"], "timedatectl show NTP: refused, it takes no operand in a probe."),
        (["chronyc"], "chronyc needs a sub-command, one of activity, "),
        (["nvidia-smi", "-i"], "nvidia-smi -i needs a value"),
        (["ping", "-i", "0.01", "10.0.0.2"], "ping -i 0.01: refused, an interval under 0.2 s floods the network"),
    ],
)  # fmt: skip
def test_refusals_name_the_program_the_argument_and_the_rule(argv: list[str], message: str) -> None:
    with pytest.raises(FanoutError, match=re.escape(message)):
        check_read_only(argv)


def test_read_only_command_line_is_quoted() -> None:
    assert check_read_only(["cat", "/proc/loadavg; reboot"]) == "cat '/proc/loadavg; reboot'"
