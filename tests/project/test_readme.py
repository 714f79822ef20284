"""The README's test command is what CI runs (.ci/run says so; this keeps it true)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _readme_test_command() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    commands = [line.strip() for block in blocks for line in block.splitlines() if "pytest" in line]
    assert len(commands) == 1, f"expected exactly one pytest command in README.md, found {commands}"
    return commands[0]


def test_ci_runs_the_readme_test_command():
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert ci_lines[-1] == _readme_test_command()


def test_readme_installs_pinned_torch_before_the_test_extra():
    command = _readme_test_command()
    assert command.index("torch==2.13.0") < command.index('".[test,oracle]"')
