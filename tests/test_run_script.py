"""tests/run's set-up steps as a newcomer sees them: what pip prints in a
step that passes goes to a log under the cache, whose path is printed; a
step that fails prints its log. Run on a copy of the script with a stand-in
Python 3.11 whose venvs' pip prints what vLLM's install prints."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
NOISE = "ERROR: pip's dependency resolver does not currently take into account all the packages that are installed."

# `python3.11 -m venv DIR` makes DIR/bin/pip, which prints pip's resolver
# complaint and fails when FAKE_PIP_FAILS names one of its arguments.
FAKE_PYTHON = f"""#!/bin/sh
if [ "$1" = -m ] && [ "$2" = venv ]; then
    mkdir -p "$3/bin"
    cat > "$3/bin/pip" <<'EOF'
#!/bin/sh
echo "{NOISE}" >&2
echo "vllm 0.33.0 requires xformers, which is not installed." >&2
for a in "$@"; do [ "$a" = "${{FAKE_PIP_FAILS:-}}" ] && exit 1; done
exit 0
EOF
    chmod +x "$3/bin/pip"
    exit 0
fi
exit 2
"""


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """The files tests/run reads, and a .venv whose python stands for pytest."""
    where = tmp_path / "clone"
    for name in ("tests/run", "tests/vllm-requirements.txt", "pyproject.toml", "setup.py",
                 "examples/plugins/xtml-citation/pyproject.toml"):
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, where / name)
    venv = where / ".venv" / "bin"
    venv.mkdir(parents=True)
    for tool, says in (("python", "pytest ran"), ("pip", "")):
        (venv / tool).write_text(f'#!/bin/sh\necho "{says}"\n')
        (venv / tool).chmod(0o755)
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "python3.11").write_text(FAKE_PYTHON)
    (shims / "python3.11").chmod(0o755)
    return where


def run(clone: Path, **env: str) -> subprocess.CompletedProcess[str]:
    if not (os.access("/usr/bin/chromium", os.X_OK) and os.access("/usr/bin/chromedriver", os.X_OK)):
        pytest.skip("tests/run would install chromium first (apt-get); tests/run installs it")
    cache = clone.parent / "cache"
    # Every other step is given its result, so only the vLLM venv is made.
    given = {"XTML_CACHE": str(cache), "XTML_LLAMA_SERVER": "/bin/true", "XTML_SMOLLM2_GGUF": "/dev/null",
             "XTML_ENGINES_PYTHON": "/bin/true", "XTML_HFJINJA": str(cache), "XTML_LLAMA_TEMPLATES": str(cache),
             "XTML_SKIP_ENGINES": "", "XTML_VLLM_PYTHON": "",
             "PATH": f"{clone.parent / 'shims'}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", str(clone / "tests" / "run"), "-k", "x"], cwd=clone,
                          env={**os.environ, **given, **env}, capture_output=True, text=True, timeout=60)


def test_a_passing_set_up_step_keeps_pips_noise_in_a_log(clone: Path) -> None:
    done = run(clone)
    assert done.returncode == 0, done.stderr
    assert "pytest ran" in done.stdout
    assert "ERROR" not in done.stderr and "requires xformers" not in done.stderr, done.stderr
    logs = list((clone.parent / "cache" / "vllm-venv").glob("*.log"))
    assert len(logs) == 1 and f"log: {logs[0]}" in done.stderr, done.stderr
    assert logs[0].read_text().count(NOISE) == 3  # three installs
    assert len(list((clone.parent / "cache" / "vllm-venv").glob("*/.complete"))) == 1
    # Made once: the next run says nothing of it.
    again = run(clone)
    assert again.returncode == 0 and "vLLM" not in again.stderr, again.stderr


def test_a_failing_set_up_step_prints_its_log(clone: Path) -> None:
    done = run(clone, FAKE_PIP_FAILS="tests/vllm-requirements.txt")
    assert done.returncode == 1
    assert "pytest ran" not in done.stdout
    assert NOISE in done.stderr and "requires xformers" in done.stderr
    assert "tests/run: failed:" in done.stderr and "vllm-requirements.txt" in done.stderr
    assert not list((clone.parent / "cache" / "vllm-venv").glob("*/.complete"))
