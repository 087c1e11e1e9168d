"""Runs scripts/lock_clocks.sh against fake nvidia-smi / nvpmodel / jetson_clocks and a fake sysfs tree."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

SCRIPT = ROOT / "scripts" / "lock_clocks.sh"
BASH = shutil.which("bash")
# The only system tools the script may use; linked into a private dir so the real PATH (and any real
# nvidia-smi on it) has no influence.
SYSTEM_TOOLS = ["cat", "readlink", "sort", "uniq", "awk", "head", "tr", "paste", "wc", "id", "mkdir",
                "dirname", "rm", "grep"]

FAKE_NVIDIA_SMI = r"""#!BASH
echo "nvidia-smi $*" >> "$FAKE_LOG"
for f in $FAKE_FAIL; do
    if [[ " $* " == *" $f "* ]]; then echo "Setting clocks is not supported on GPU 0 (fake)"; exit 3; fi
done
case "$*" in
    "-L") echo "GPU 0: NVIDIA Fake 100 (UUID: GPU-00000000)" ;;
    "--query-gpu=persistence_mode --format=csv,noheader") echo "${FAKE_PM:-Disabled}" ;;
    "--query-supported-clocks=memory,graphics --format=csv,noheader,nounits")
        printf '2619, 1980\n2619, 1965\n2619, 345\n1593, 1995\n' ;;
    --query-gpu=clocks*)
        echo "clocks.current.sm [MHz], clocks.max.sm [MHz], clocks.current.memory [MHz], \
clocks.max.memory [MHz], persistence_mode"
        echo "1980 MHz, 1980 MHz, 2619 MHz, 2619 MHz, Enabled" ;;
    *) echo "ok" ;;
esac
"""

FAKE_NVPMODEL = r"""#!BASH
cmd="nvpmodel${*:+ $*}"
echo "$cmd" >> "$FAKE_LOG"
if [[ "$cmd" == "$FAKE_FAIL_CMD" ]]; then echo "$cmd failed (fake)"; exit 1; fi
if [[ "$*" == "-q" ]]; then printf 'NV Power Mode: MODE_15W\n2\n'; fi
"""

FAKE_JETSON_CLOCKS = r"""#!BASH
cmd="jetson_clocks${*:+ $*}"
echo "$cmd" >> "$FAKE_LOG"
if [[ "$cmd" == "$FAKE_FAIL_CMD" ]]; then echo "$cmd failed (fake)"; exit 1; fi
if [[ "$1" == "--store" ]]; then echo "stored clocks" > "$2"; fi
if [[ "$1" == "--show" ]]; then echo "GPU MinFreq=114750000 MaxFreq=1300500000 CurrentFreq=1300500000"; fi
"""


class Env:
    """A tmp tree: fake sysfs root, fake tools, state dir, and helpers to run the script there."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.root = tmp / "sysfs"
        self.cpu = self.root / "sys/devices/system/cpu"
        self.cpu.mkdir(parents=True)
        self.fakes = tmp / "fakes"
        self.fakes.mkdir()
        self.sysbin = tmp / "sysbin"
        self.sysbin.mkdir()
        for tool in SYSTEM_TOOLS:
            found = shutil.which(tool)
            assert found, f"system tool {tool} missing"
            (self.sysbin / tool).symlink_to(found)
        self.log = tmp / "calls.log"
        self.log.write_text("")
        self.state = tmp / "state" / "clock_state"
        self.extra_env: dict[str, str] = {}

    def add_cpus(self, n: int = 2, governor: str = "powersave") -> None:
        for i in range(n):
            d = self.cpu / f"cpu{i}" / "cpufreq"
            d.mkdir(parents=True)
            (d / "scaling_governor").write_text(governor + "\n")

    def add_file(self, rel: str, text: str) -> Path:
        path = self.cpu / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def add_fake(self, name: str, body: str) -> None:
        path = self.fakes / name
        path.write_text(body.replace("BASH", BASH, 1))
        path.chmod(0o755)

    def add_nvidia(self) -> None:
        self.add_fake("nvidia-smi", FAKE_NVIDIA_SMI)

    def add_jetson(self) -> None:
        self.add_fake("nvpmodel", FAKE_NVPMODEL)
        self.add_fake("jetson_clocks", FAKE_JETSON_CLOCKS)

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        full_env = {
            "PATH": f"{self.fakes}:{self.sysbin}",
            "POMT_SYSFS_ROOT": str(self.root),
            "POMT_REQUIRE_ROOT": "0",
            "FAKE_LOG": str(self.log),
            "LC_ALL": "C",
        }
        full_env.update(self.extra_env)
        full_env.update(env)
        return subprocess.run([BASH, str(SCRIPT), "--state-file", str(self.state), *args],
                              env=full_env, capture_output=True, text=True, timeout=30)

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines()

    def changes(self) -> list[str]:
        """Logged calls that change something (queries left out)."""
        return [c for c in self.calls() if "--query" not in c and c not in ("nvidia-smi -L", "nvpmodel -q")]

    def snapshot(self) -> dict[str, bytes]:
        files = sorted(p for p in self.root.rglob("*") if p.is_file())
        return {str(p.relative_to(self.root)): p.read_bytes() for p in files}

    def state_lines(self) -> list[list[str]]:
        return [line.split("\t") for line in self.state.read_text().splitlines() if not line.startswith("#")]


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stderr + result.stdout
    return result


def one_error_line(result: subprocess.CompletedProcess, code: int) -> str:
    assert result.returncode == code, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_cpu_lock_then_unlock_restores_intel_pstate_exactly(env: Env):
    env.add_cpus(2)
    env.add_file("intel_pstate/no_turbo", "0\n")
    before = env.snapshot()

    out = ok(env.run("lock")).stdout
    gov0 = env.cpu / "cpu0/cpufreq/scaling_governor"
    assert gov0.read_text() == "performance\n"
    assert (env.cpu / "cpu1/cpufreq/scaling_governor").read_text() == "performance\n"
    assert (env.cpu / "intel_pstate/no_turbo").read_text() == "1\n"
    assert f"+ echo performance > {gov0}" in out
    assert env.state_lines() == [
        ["sysfs", str(gov0), "powersave"],
        ["sysfs", str(env.cpu / "cpu1/cpufreq/scaling_governor"), "powersave"],
        ["sysfs", str(env.cpu / "intel_pstate/no_turbo"), "0"],
    ]
    assert env.calls() == []  # CPU only: the real nvidia-smi (if any) is out of reach

    ok(env.run("unlock"))
    assert env.snapshot() == before
    assert not env.state.exists()


def test_cpu_boost_is_turned_off_and_restored(env: Env):
    env.add_cpus(1, governor="schedutil")
    boost = env.add_file("cpufreq/boost", "1\n")
    before = env.snapshot()
    ok(env.run("--target", "cpu", "lock"))
    assert boost.read_text() == "0\n"
    ok(env.run("unlock"))
    assert env.snapshot() == before


def test_values_already_set_are_not_recorded(env: Env):
    env.add_cpus(2, governor="performance")
    env.add_file("intel_pstate/no_turbo", "0\n")
    ok(env.run("lock"))
    assert env.state_lines() == [["sysfs", str(env.cpu / "intel_pstate/no_turbo"), "0"]]


def test_lock_twice_refuses_and_keeps_first_state(env: Env):
    env.add_cpus(2)
    ok(env.run("lock"))
    state = env.state.read_bytes()
    after_first = env.snapshot()
    line = one_error_line(env.run("lock"), 1)
    assert "already active" in line
    assert env.state.read_bytes() == state
    assert env.snapshot() == after_first


def test_dry_run_prints_plan_and_changes_nothing(env: Env):
    env.add_cpus(2)
    env.add_file("intel_pstate/no_turbo", "0\n")
    env.add_nvidia()
    before = env.snapshot()
    result = ok(env.run("--dry-run", "lock", POMT_REQUIRE_ROOT="1", POMT_FAKE_UID="1000"))
    plan = [line for line in result.stdout.splitlines() if line.startswith("+ ")]
    assert plan == [
        f"+ echo performance > {env.cpu / 'cpu0/cpufreq/scaling_governor'}",
        f"+ echo performance > {env.cpu / 'cpu1/cpufreq/scaling_governor'}",
        f"+ echo 1 > {env.cpu / 'intel_pstate/no_turbo'}",
        "+ nvidia-smi -pm 1",
        "+ nvidia-smi -lgc 1980,1980",
        "+ nvidia-smi -lmc 2619,2619",
    ]
    assert env.snapshot() == before
    assert not env.state.exists()
    assert env.changes() == []


def test_dry_run_unlock_prints_restore_plan(env: Env):
    env.add_cpus(1)
    ok(env.run("lock"))
    after_lock = env.snapshot()
    result = ok(env.run("--dry-run", "unlock"))
    assert f"+ echo powersave > {env.cpu / 'cpu0/cpufreq/scaling_governor'}" in result.stdout
    assert env.snapshot() == after_lock
    assert env.state.exists()


@pytest.mark.parametrize("command", ["lock", "unlock"])
def test_non_root_refuses_with_one_line(env: Env, command: str):
    env.add_cpus(2)
    before = env.snapshot()
    line = one_error_line(env.run(command, POMT_REQUIRE_ROOT="1", POMT_FAKE_UID="1000"), 2)
    assert "root" in line
    assert env.snapshot() == before
    assert not env.state.exists()


def test_nvidia_lock_and_unlock_order(env: Env):
    env.add_cpus(1)
    env.add_nvidia()
    before = env.snapshot()
    ok(env.run("lock"))
    assert env.changes() == ["nvidia-smi -pm 1", "nvidia-smi -lgc 1980,1980", "nvidia-smi -lmc 2619,2619"]
    assert env.state_lines() == [
        ["sysfs", str(env.cpu / "cpu0/cpufreq/scaling_governor"), "powersave"],
        ["nvidia", "persistence", "Disabled"],
        ["nvidia", "gpu_clocks", "locked"],
        ["nvidia", "mem_clocks", "locked"],
    ]
    env.log.write_text("")
    ok(env.run("unlock"))
    assert env.changes() == ["nvidia-smi -rmc", "nvidia-smi -rgc", "nvidia-smi -pm 0"]
    assert env.snapshot() == before


def test_nvidia_previous_persistence_enabled_is_kept(env: Env):
    env.add_nvidia()
    env.extra_env["FAKE_PM"] = "Enabled"
    ok(env.run("--target", "nvidia", "lock"))
    env.log.write_text("")
    ok(env.run("unlock"))
    assert env.changes()[-1] == "nvidia-smi -pm 1"


def test_nvidia_given_clocks_skip_the_query(env: Env):
    env.add_nvidia()
    ok(env.run("--target", "nvidia", "--gpu-clock", "1500", "--mem-clock", "1593", "lock"))
    assert not any("query-supported-clocks" in c for c in env.calls())
    assert env.changes() == ["nvidia-smi -pm 1", "nvidia-smi -lgc 1500,1500", "nvidia-smi -lmc 1593,1593"]


def test_nvidia_mem_clock_only_picks_highest_graphics_for_it(env: Env):
    env.add_nvidia()
    ok(env.run("--target", "nvidia", "--mem-clock", "1593", "lock"))
    assert "nvidia-smi -lgc 1995,1995" in env.changes()


def test_fallback_to_application_clocks_when_lgc_fails(env: Env):
    env.add_nvidia()
    env.extra_env["FAKE_FAIL"] = "-lgc"
    result = ok(env.run("--target", "nvidia", "lock"))
    assert "application clocks" in result.stdout
    assert env.changes() == ["nvidia-smi -pm 1", "nvidia-smi -lgc 1980,1980", "nvidia-smi -ac 2619,1980"]
    assert env.state_lines() == [["nvidia", "persistence", "Disabled"], ["nvidia", "app_clocks", "set"]]
    env.log.write_text("")
    ok(env.run("unlock"))
    assert env.changes() == ["nvidia-smi -rac", "nvidia-smi -pm 0"]


def test_fallback_when_lmc_fails_resets_graphics_lock_first(env: Env):
    env.add_nvidia()
    env.extra_env["FAKE_FAIL"] = "-lmc"
    ok(env.run("--target", "nvidia", "lock"))
    assert env.changes() == ["nvidia-smi -pm 1", "nvidia-smi -lgc 1980,1980", "nvidia-smi -lmc 2619,2619",
                             "nvidia-smi -rgc", "nvidia-smi -ac 2619,1980"]
    assert env.state_lines() == [["nvidia", "persistence", "Disabled"], ["nvidia", "app_clocks", "set"]]


def test_midway_failure_rolls_back_everything(env: Env):
    env.add_cpus(2)
    env.add_file("intel_pstate/no_turbo", "0\n")
    env.add_nvidia()
    before = env.snapshot()
    env.extra_env["FAKE_FAIL"] = "-lgc -ac"
    line = one_error_line(env.run("lock"), 1)
    assert "rolled back" in line
    assert env.snapshot() == before
    assert not env.state.exists()
    assert env.changes() == ["nvidia-smi -pm 1", "nvidia-smi -lgc 1980,1980", "nvidia-smi -ac 2619,1980",
                             "nvidia-smi -pm 0"]


def test_jetson_lock_and_unlock(env: Env):
    env.add_cpus(1)
    env.add_jetson()
    env.add_nvidia()  # Jetson wins over nvidia-smi and the CPU: jetson_clocks covers them
    before = env.snapshot()
    store = f"{env.state}.jetson"
    ok(env.run("lock"))
    assert env.changes() == [f"jetson_clocks --store {store}", "nvpmodel -m 0", "jetson_clocks"]
    assert env.state_lines() == [["jetson", "2", store]]
    assert env.snapshot() == before
    env.log.write_text("")
    ok(env.run("unlock"))
    assert env.changes() == ["nvpmodel -m 2", f"jetson_clocks --restore {store}"]
    assert not env.state.exists()
    assert not Path(store).exists()


def test_jetson_given_mode_and_rollback(env: Env):
    env.add_jetson()
    env.extra_env["FAKE_FAIL_CMD"] = "jetson_clocks"
    store = f"{env.state}.jetson"
    line = one_error_line(env.run("--nvpmodel-mode", "3", "lock"), 1)
    assert "rolled back" in line
    assert env.changes() == [f"jetson_clocks --store {store}", "nvpmodel -m 3", "jetson_clocks",
                             "nvpmodel -m 2", f"jetson_clocks --restore {store}"]
    assert not env.state.exists()


def test_unlock_keeps_failed_steps(env: Env):
    env.add_cpus(1)
    env.add_nvidia()
    before = env.snapshot()
    ok(env.run("lock"))
    line = one_error_line(env.run("unlock", FAKE_FAIL="-rgc"), 1)
    assert "1 of 4" in line
    assert env.state_lines() == [["nvidia", "gpu_clocks", "locked"]]
    assert env.snapshot() == before
    ok(env.run("unlock"))
    assert not env.state.exists()


def test_unlock_without_lock_is_a_no_op(env: Env):
    env.add_cpus(1)
    result = ok(env.run("unlock"))
    assert "nothing to restore" in result.stdout


def test_nothing_to_lock(env: Env):
    line = one_error_line(env.run("lock"), 1)
    assert "nothing to lock" in line


def test_status_reports_state_and_lock(env: Env):
    env.add_cpus(2)
    env.add_file("intel_pstate/no_turbo", "0\n")
    env.add_nvidia()
    out = ok(env.run("status")).stdout
    assert "cpu governor: powersave x2" in out
    assert "cpu turbo: on" in out
    assert "1980 MHz, 1980 MHz, 2619 MHz, 2619 MHz, Enabled" in out
    assert "pomt lock: none" in out
    ok(env.run("lock"))
    out = ok(env.run("status")).stdout
    assert "cpu governor: performance x2" in out
    assert "cpu turbo: off" in out
    assert "pomt lock: active" in out


def test_status_jetson(env: Env):
    env.add_jetson()
    out = ok(env.run("--target", "jetson", "status")).stdout
    assert "MODE_15W" in out and "CurrentFreq" in out


@pytest.mark.parametrize("args", [
    [],
    ["frobnicate"],
    ["lock", "unlock"],
    ["--target", "tpu", "lock"],
    ["--gpu-clock", "fast", "lock"],
    ["--mem-clock", "0", "lock"],
    ["--nvpmodel-mode", "-1", "lock"],
    ["lock", "--target"],
])
def test_bad_usage_is_one_line_and_exit_2(env: Env, args: list[str]):
    one_error_line(env.run(*args), 2)


def test_shellcheck_clean():
    venv_bin = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin"
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(venv_bin))
    if shellcheck is None:
        pytest.skip("shellcheck not installed")
    result = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
