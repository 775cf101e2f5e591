"""scripts/check-markdown (run by `make lint`): broken fences, headings that render as text or code,
links to missing files and anchors fail it; the repository's own Markdown passes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "check-markdown"


def check(root: Path, *files: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), *(str(root / f) for f in files)],
                          capture_output=True, text=True, timeout=120)


def write(root: Path, name: str, text: str) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_repositorys_markdown_passes():
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_clean_document_with_links_and_anchors_passes(tmp_path):
    write(tmp_path, "docs/other.md", "# Other page\n\n## Arms: compare anything, not just stacks\n\n"
                                     "## Setup\n\n## Setup\n\n<a id=\"custom\"></a>\n")
    write(tmp_path, "README.md", "# Title\n\n## Using it\n\n```bash\n# a shell comment, not a heading\nls\n```\n\n"
                                 "See [here](#using-it), [arms](docs/other.md#arms-compare-anything-not-just-stacks), "
                                 "[the second setup](docs/other.md#setup-1), [custom](docs/other.md#custom), "
                                 "[the folder](docs/) and [the web](https://example.com/x#y).\n")
    out = check(tmp_path, "README.md", "docs/other.md")
    assert out.returncode == 0, out.stdout + out.stderr


def test_an_unclosed_fence_fails(tmp_path):
    write(tmp_path, "README.md", "# Title\n\n```yaml\nname: x\n\n## Not a heading any more\n")
    out = check(tmp_path, "README.md")
    assert out.returncode == 1
    assert "README.md:3: code fence ```yaml is never closed" in out.stdout


def test_a_fence_cut_short_so_headings_render_as_code_fails(tmp_path):
    # the README's old breakage: a YAML example cut mid-line lost its closing fence; the next opening
    # fence cannot close it, and the heading between them renders as code
    write(tmp_path, "README.md", "# Title\n\n```yaml\nmetrics:\n  - {name: loss, margin: 0.Built-in workloads\n\n"
                                 "### Your own training code\n\nText.\n\n```python\nx = 1\n```\n")
    out = check(tmp_path, "README.md")
    assert out.returncode == 1
    assert "README.md:11: '```python' inside the fence opened at line 3" in out.stdout
    assert "README.md:7: '### Your own training code' looks like a heading but does not render as one" in out.stdout


def test_a_link_to_a_missing_file_fails(tmp_path):
    write(tmp_path, "README.md", "# Title\n\nSee [the guide](docs/guide.md) and ![chart](img/chart.png).\n")
    out = check(tmp_path, "README.md")
    assert out.returncode == 1
    assert "README.md:3: link to a missing file: docs/guide.md" in out.stdout
    assert "link to a missing file: img/chart.png" in out.stdout


def test_links_to_missing_anchors_fail(tmp_path):
    write(tmp_path, "docs/other.md", "# Other\n\n## Present\n")
    write(tmp_path, "README.md", "# Title\n\n## Arms\n\n[same file](#arms-compare-anything)\n\n"
                                 "[other file](docs/other.md#absent) [fine](docs/other.md#present)\n")
    out = check(tmp_path, "README.md")
    assert out.returncode == 1
    assert "README.md:5: link to a missing anchor: #arms-compare-anything" in out.stdout
    assert "README.md:7: link to a missing anchor in docs/other.md: #absent" in out.stdout
    assert "#present" not in out.stdout


def test_a_named_file_that_does_not_exist_is_a_usage_error(tmp_path):
    out = check(tmp_path, "nope.md")
    assert out.returncode == 2
    assert "no such file" in out.stderr
