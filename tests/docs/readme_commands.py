"""The README and the docs are tested (issues 21, 41): every shell command in README.md, docs/*.md,
samples/README.md and samples/*/README.md runs as typed, in order, and writes what it says it writes.

Where it sits: ctest `docs.readme_commands` (tests/CMakeLists.txt) runs it with ${PT_PYTHON} and
the built binary after the build; it reads the Markdown files and nothing of the program's source.

What counts as a command:
  - every line of a ```sh block (a `\\` at the end of a line joins the next; `#` starts a comment);
  - in a plain ``` block, lines that start with `$ ` (a transcript): the command after `$ ` runs,
    and every line the block shows below it, `...` aside, must appear in its output;
  - an indented (4-space) code block whose first line starts like a command (`./`, `build/`,
    `.venv`, `/usr/bin/...`, `python3`, `bash`, `cd`): the samples' READMEs write commands so.
    Indented blocks of other text (a model's greedy continuation) are printed as text, not run.

How they run: documents in reading order (README.md; then docs/ in the order of DOCS below, any
other docs/*.md after them by name; then samples/README.md and samples/*/README.md), commands in
document order, each with `bash -c` from the root of one scratch folder for all the documents. The scratch folder holds a copy of samples/ (the regeneration commands write into it,
never into the checkout), `build` -> the folder of --pipetrain, `.venv` -> the venv of --python,
and its own out/; nothing in the checkout is written. A `cd DIR` line moves the following lines of
its block (a reader's terminal); each block starts again at the scratch root. Every `pipetrain
train` line gets `--set steps=3` appended (the main job is 400 steps).

Checks, per command: the exit code is 0, or N where its comment says `exits N`/`exit code N`;
every path it names as an output exists afterwards: the value of --output/--out/-o/--export/
--csv/--svg, and every `-> PATH` that ends a line it prints, PATH with a folder or an extension (`trained model ->
out/charlm/charlm_trained.onnx`);
a `pipetrain train` that trains (does not say `nothing to do`) names its trained model. The run
fails if a document has no command or if an entry of SKIP below matches no command (the list
cannot rot). Prints one line per command (ok / SKIP with its reason / FAIL with the output tail);
exits 1 on any failure.

Usage: readme_commands.py --pipetrain build/pipetrain --python .venv/bin/python --repo . [--keep]
"""
import argparse
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

# Commands that cannot run in CI, each with its reason (a regular expression matched against the
# whole command, comments stripped). Everything else runs.
SKIP = [
    # Set-up: installs apt and pip packages (root, network), then builds; the test runs on that
    # build. Its training part runs instead, see STAND_IN.
    (r"bash scripts/main_job\.sh", "set-up: installs packages (apt, pip: network, root) and builds"),
    # The whole test suite, this test included.
    (r"bash scripts/test\.sh", "set-up and the whole test suite (this test is part of it)"),
    # The sanitizer and fuzz builds: clang from apt (root, network), a build of their own of
    # tens of minutes; CI runs `sanitize.sh asan`, `sanitize.sh tsan` and `fuzz.sh 30` as steps of .ci/run.
    (r"bash scripts/sanitize\.sh", "a sanitizer build of its own (clang from apt), run by .ci/run"),
    (r"bash scripts/fuzz\.sh", "the fuzz build (clang from apt) and minutes of fuzzing, run by .ci/run"),
    # The export venv (.venv-export: PyTorch 2.15, transformers from PyPI, about 5 GB): CI has
    # none; the fixtures it makes are committed and tested by the oracle.* tests.
    (r"bash scripts/export_venv\.sh", "makes the export venv from PyPI (network, about 5 GB)"),
    (r"\.venv-export/bin/python", "needs the export venv (.venv-export), which CI does not have"),
    # samples/export_model/README.md: trains the net.onnx that the export venv makes, with the
    # user's own train.yaml beside it (oracle.export_model_pytorch runs this path on fixtures).
    (r"build/pipetrain train train\.yaml", "trains net.onnx, which the export venv makes"),
    # samples/export_model/README.md: Python typed into PyTorch, not a shell command.
    (r"net\.load_state_dict\(", "Python (in PyTorch with the safetensors package), not shell"),
]

# A skipped command whose effect the following commands rely on: what runs in its place.
# scripts/main_job.sh ends with this line (it passes --overwrite unless given --resume).
STAND_IN = {
    r"bash scripts/main_job\.sh": "./build/pipetrain train samples/charlm/train.yaml --overwrite",
}

# docs/ in reading order (the order of the README's table of pages): a page may use what an
# earlier one wrote (out/ files; a `--resume` after a `train`). A page missing from this list still
# runs, after these, in name order.
DOCS = ["docs/cli.md", "docs/configuration.md", "docs/export.md", "docs/training.md",
        "docs/schedules.md", "docs/measured.md", "docs/testing.md", "docs/design.md"]

STEPS = "--set steps=3"
OUTPUT_FLAGS = ("--output", "--out", "-o", "--export", "--csv", "--svg")
COMMAND_START = re.compile(r"^(\./|\.\./|/usr/bin/|build/|\.venv|python3?\b|bash\b|cd\b)")


class Command:
    def __init__(self, doc, line, text, block, expect_lines=None):
        self.doc, self.line, self.block = doc, line, block
        self.text, comment = split_comment(text)
        self.comment = comment
        self.expect_lines = expect_lines or []
        m = re.search(r"\bexit(?:s| code)? (\d+)\b", comment)
        self.expected_rc = int(m.group(1)) if m else 0

    def where(self):
        return "%s:%d" % (self.doc, self.line)


def split_comment(text):
    """The command and its trailing `# comment` (a # outside quotes after a space)."""
    quote = None
    for i, c in enumerate(text):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].rstrip(), text[i + 1:].strip()
    return text.rstrip(), ""


def join_continued(lines):
    """(line number, text) pairs with `\\`-continued lines joined."""
    out, cur, start = [], None, 0
    for n, raw in lines:
        piece = raw.strip()
        if cur is None:
            cur, start = "", n
        if piece.endswith("\\"):
            cur += piece[:-1].rstrip() + " "
            continue
        cur += piece
        out.append((start, cur))
        cur = None
    if cur is not None:
        out.append((start, cur.strip()))
    return out


def extract(path, rel):
    """The commands of one Markdown file, in order, and the indented text blocks left as text."""
    lines = open(path, encoding="utf-8").read().split("\n")
    commands, texts, block = [], [], 0
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = re.match(r"^\s*```(\S*)", line)
        if fence:
            lang = fence.group(1)
            j = i + 1
            while j < len(lines) and not re.match(r"^\s*```", lines[j]):
                j += 1
            body = [(k + 1, lines[k]) for k in range(i + 1, j)]
            block += 1
            if lang in ("sh", "bash", "shell", "console"):
                for n, text in join_continued([(n, t) for n, t in body if t.strip()]):
                    if text.startswith("#"):
                        continue
                    commands.append(Command(rel, n, text, block))
            elif lang == "":
                cur = None
                for n, t in body:
                    if t.startswith("$ "):
                        cur = Command(rel, n, t[2:], block)
                        commands.append(cur)
                    elif cur is not None and t.strip() and t.strip() != "...":
                        cur.expect_lines.append(t.strip())
            i = j + 1
            continue
        # An indented code block: 4 spaces after a blank line, outside lists.
        if line.startswith("    ") and line.strip() and i > 0 and not lines[i - 1].strip():
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            body = [(k + 1, lines[k][4:]) for k in range(i, j) if lines[k].strip()]
            block += 1
            if COMMAND_START.match(body[0][1]):
                for n, text in join_continued(body):
                    if text.startswith("#"):
                        continue
                    commands.append(Command(rel, n, text, block))
            else:
                texts.append((rel, body[0][0], body[0][1]))
            i = j
            continue
        i += 1
    return commands, texts


def skip_reason(text):
    for pattern, reason in SKIP:
        if re.search(pattern, text):
            return pattern, reason
    return None, None


def named_outputs(cmd_text, output):
    """Paths the command names as its outputs: output flags' values, and `-> PATH` it prints."""
    paths = []
    try:
        words = shlex.split(cmd_text)
    except ValueError:
        words = cmd_text.split()
    for k, w in enumerate(words):
        if w in OUTPUT_FLAGS and k + 1 < len(words):
            paths.append(words[k + 1])
        for flag in OUTPUT_FLAGS:
            if w.startswith(flag + "="):
                paths.append(w[len(flag) + 1:])
    # `-> PATH` at the end of a line, PATH with a folder or an extension (not `float32 -> bool`).
    for m in re.finditer(r"-> (\S+)[ \t]*$", output, re.M):
        if "/" in m.group(1) or re.search(r"\.\w+$", m.group(1)):
            paths.append(m.group(1))
    return paths


def make_scratch(repo, pipetrain, python):
    root = tempfile.mkdtemp(prefix="pt_readme_")
    shutil.copytree(os.path.join(repo, "samples"), os.path.join(root, "samples"), symlinks=True)
    os.symlink(os.path.dirname(os.path.abspath(pipetrain)), os.path.join(root, "build"))
    venv = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    if os.path.exists(os.path.join(venv, "pyvenv.cfg")):
        os.symlink(venv, os.path.join(root, ".venv"))
    else:  # a python outside a venv: .venv/bin/python is that python
        os.makedirs(os.path.join(root, ".venv", "bin"))
        os.symlink(os.path.abspath(python), os.path.join(root, ".venv", "bin", "python"))
    return root


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipetrain", required=True)
    ap.add_argument("--python", default=sys.executable, help="the python .venv/bin/python stands for")
    ap.add_argument("--repo", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per command")
    args = ap.parse_args()
    repo = os.path.abspath(args.repo)

    in_docs = sorted(os.path.relpath(p, repo) for p in glob.glob(os.path.join(repo, "docs", "*.md")))
    docs = (["README.md"] + [d for d in DOCS if d in in_docs] + [d for d in in_docs if d not in DOCS]
            + ["samples/README.md"] + sorted(
                os.path.relpath(p, repo) for p in glob.glob(os.path.join(repo, "samples", "*", "README.md"))))
    commands, failures = [], []
    for rel in docs:
        cmds, texts = extract(os.path.join(repo, rel), rel)
        for doc, n, first in texts:
            print("text  %s:%d  %s" % (doc, n, first[:70]))
        if rel in ("README.md", "samples/charlm/README.md") and not cmds:
            failures.append("%s: no command found" % rel)
        commands += cmds

    root = make_scratch(repo, args.pipetrain, args.python)
    used_skips = set()
    env = dict(os.environ)
    # mpirun refuses to start as root unless told; CI runs as root in its fresh Debian root.
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    ran = 0
    try:
        cwd, block = root, None
        for c in commands:
            if c.block != block:
                cwd, block = root, c.block
            pattern, reason = skip_reason(c.text)
            text = c.text
            if pattern is not None:
                used_skips.add(pattern)
                print("SKIP  %s  %s\n      (%s)" % (c.where(), c.text, reason))
                if pattern not in STAND_IN:
                    continue
                text = STAND_IN[pattern]
                print("      in its place: %s" % text)
            words = text.split()
            if words and words[0] == "cd":
                cwd = os.path.normpath(os.path.join(cwd, words[1] if len(words) > 1 else root))
                if not cwd.startswith(root) or not os.path.isdir(cwd):
                    failures.append("%s: cd %s: no such folder" % (c.where(), words[1:]))
                    cwd = root
                print("ok    %s  %s" % (c.where(), text))
                continue
            is_train = re.search(r"pipetrain train\b", text) is not None
            if is_train:
                text += " " + STEPS
            try:
                p = subprocess.run(["bash", "-c", text], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, timeout=args.timeout)
                out, rc = p.stdout.decode("utf-8", "replace"), p.returncode
            except subprocess.TimeoutExpired:
                out, rc = "(timed out after %d s)" % args.timeout, -1
            ran += 1
            problems = []
            if rc != c.expected_rc:
                problems.append("exit code %d, expected %d" % (rc, c.expected_rc))
            if rc == 0:
                for path in named_outputs(text, out):
                    if not os.path.exists(os.path.join(cwd, path)):
                        problems.append("names the output %s, which does not exist" % path)
                if is_train and "nothing to do" not in out and "trained model -> " not in out:
                    problems.append("trains but names no trained model (`trained model -> PATH`)")
                for want in c.expect_lines:
                    if want not in out:
                        problems.append("the document shows the line %r, not in the output" % want)
            if problems:
                tail = "\n".join("        " + l for l in out.rstrip().split("\n")[-15:])
                failures.append("%s: %s\n      %s\n%s" % (c.where(), text, "; ".join(problems), tail))
                print("FAIL  %s  %s\n      %s\n%s" % (c.where(), text, "; ".join(problems), tail))
            else:
                print("ok    %s  %s" % (c.where(), text))
    finally:
        if args.keep:
            print("scratch folder kept: %s" % root)
        else:
            shutil.rmtree(root, ignore_errors=True)

    for pattern, reason in SKIP:
        if pattern not in used_skips:
            failures.append("SKIP entry %r (%s) matches no command: remove it" % (pattern, reason))
    print("\n%d commands ran, %d skipped, %d failed" % (ran, sum(
        1 for c in commands if skip_reason(c.text)[0] is not None), len(failures)))
    for f in failures:
        print("FAILED: " + f.split("\n")[0])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
