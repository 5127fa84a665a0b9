"""The shell commands of README.md and docs/*.md, found and split into argv.

tests/commands/test_docs_commands.py checks and runs them; this module only
reads the docs into DocCommand records.

Which text is a command
  * Fenced code blocks: a block is a shell block when its language is sh /
    bash / shell / console, or its first line is a command (a `$ ` prompt,
    a program of PROGRAMS) or a `NAME=value` assignment.  Backslash
    continuations are joined, `# comments` dropped, `$NAME` expanded from
    the block's assignments, and optional parts written in brackets
    (`[more.txt ...]`) left out.  After a `$ ` prompt, the lines up to the
    next prompt are the command's printed output.  Every line of a shell
    block must be a command of PROGRAMS, an assignment, output or one of
    IGNORED_PROGRAMS: any other program fails, so that a new kind of
    command gets a check here.
  * Inline `code` spans that start with a program of PROGRAMS and have
    arguments.  They are prose shorthand (`mtf_th train --train_steps N`,
    `mtf_th decode [--input T ...|--input_file F]`, `mtf_th sweep`), so
    they are checked for names only: the subcommand exists, every --flag is
    an option of its real parser, a --paper_table is a table, a --gin_file
    exists, a make target exists, a script exists.  `python -c` spans run.
    Fenced templates (a `<placeholder>` or `...` left after the brackets
    are dropped, e.g. docs/sweeps.md's `mtf_th train --model_dir
    DIR/runs/<row>/seed_<n> ...`) are checked the same way.
"""
import dataclasses
import glob
import os
import re
import shlex
import sys

from _cli_util import REPO

BIN = os.path.dirname(sys.executable)
DOCS = ["README.md"] + sorted(
    os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs",
                                                             "*.md")))

# The only changes made to a command before it runs (slow tests): sizes,
# steps and the model a command reads.  (old, new, why)
SUBSTITUTIONS = (
    ("--train_steps=300", "--train_steps=3",
     "quick start: 3 steps, not 300"),
    ("sweeps/t5_heads_tiny/runs/07_talking_heads_24_32/seed_1", "runs/th24",
     "visualize: the quick start's model (the same row at tiny scale)"),
    ("sweeps/lm_heads/runs/08_talking_heads_32_4/seed_1", "runs/th24",
     "visualize: the quick start's model"),
    ("--size 8000", "--size 300", "vocabulary: 300 pieces of a small text"),
)

PROGRAMS = ("mtf_th", "t5_mesh_transformer", "make", "python", "python3",
            "pytest", "bash")
SCRIPT_DIRS = ("launch/", "benchmarks/")
IGNORED_PROGRAMS = ("printf",)  # writes an input file for the next command
# mtf_th commands that build no graph: run here, output compared with the doc
PURE_PYTHON = ("costs", "perf", "plan")
SHELL_LANGUAGES = ("sh", "bash", "shell", "console")
# a token that stands for something: <row>, ..., a|b (and [optional]
# parts, see DocCommand.placeholders).  Values such as MY_PROJECT are
# written out and used as they are.
PLACEHOLDER = re.compile(r"\.\.\.|[<>|]")


@dataclasses.dataclass
class DocCommand:
  """One command shown in a doc."""
  path: str          # e.g. "docs/training.md"
  line: int          # 1-based line of its first line
  text: str          # as shown (continuations joined, comment dropped)
  argv: list         # tokens, brackets left out, $NAME expanded
  raw_argv: list     # tokens as shown (for the names-only check)
  inline: bool       # an inline `code` span
  heading: str       # the section it is under
  output: list       # the output the doc shows for it ($ prompts)

  @property
  def where(self):
    return "%s:%d" % (self.path, self.line)

  @property
  def placeholders(self):
    """Whether it is a template (what stands in brackets is left out)."""
    return any(PLACEHOLDER.search(t) for t in self.argv[1:])

  def __str__(self):
    return "%s: %s" % (self.where, self.text)


# --------------------------------------------------------------- extraction
def shell_words(text):
  try:
    return shlex.split(text, comments=True)
  except ValueError:  # an unbalanced quote in a template (<row's files>)
    return text.split("#")[0].split()


def program_name(token):
  """The program a first token names (None: not a command of PROGRAMS)."""
  name = token[len(".venv/bin/"):] if token.startswith(".venv/bin/") else token
  if name in PROGRAMS:
    return name
  if token.startswith(SCRIPT_DIRS):
    return "script"
  return None


def _drop_brackets(text):
  """`a [--b c] d` -> `a d`: optional parts are left out."""
  while True:
    new = re.sub(r"\s*\[[^\[\]]*\]", "", text)
    if new == text:
      return new
    text = new


def _logical_lines(lines, first):
  """(line number, text) with backslash continuations joined."""
  out, buf, start = [], "", None
  for i, line in enumerate(lines):
    if start is None:
      start = first + i
    if line.rstrip().endswith("\\"):
      buf += line.rstrip()[:-1] + " "
      continue
    out.append((start, buf + line))
    buf, start = "", None
  if buf:
    out.append((start, buf))
  return out


_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(\S+)$")


def _is_shell_block(language, lines):
  if language in SHELL_LANGUAGES:
    return True
  for line in lines:
    text = line.strip()
    if not text or text.startswith("#"):
      continue
    if text.startswith("$ ") or _ASSIGNMENT.match(text):
      return True
    tokens = shell_words(text)
    return bool(tokens) and program_name(tokens[0]) is not None
  return False


def _make_command(path, number, text, env, inline, heading):
  for name, value in env.items():
    text = text.replace("$" + name, value)
  raw = shell_words(text)
  return DocCommand(path, number, text.split(" #")[0].strip(),
                    shell_words(_drop_brackets(text)), raw, inline, heading, [])


def _block_commands(path, first, language, lines, heading, after):
  """The commands of one shell block; `after`: the doc's lines after it."""
  found, env, current = [], {}, None
  prompts = any(l.startswith("$ ") for l in lines)
  for number, line in _logical_lines(lines, first):
    text = line.strip()
    if prompts and not text.startswith("$ "):
      if current is not None and text:
        current.output.append(text)
      continue
    text = text[2:] if text.startswith("$ ") else text
    if not text or text.startswith("#"):
      continue
    assignment = _ASSIGNMENT.match(text)
    if assignment:
      env[assignment.group(1)] = assignment.group(2)
      continue
    current = _make_command(path, number, text, env, False, heading)
    found.append(current)
  if prompts and found and not found[-1].output:
    found[-1].output = _table_after(after)
  return found


def _table_after(lines):
  """The markdown table right after a block (blank lines skipped)."""
  table = []
  for line in lines:
    if not line.strip() and not table:
      continue
    if not line.startswith("|"):
      break
    table.append(line.strip())
  return table


def _inline_commands(path, number, line, heading):
  found = []
  for span in re.findall(r"`([^`]+)`", line):
    tokens = shell_words(span)
    if len(tokens) < 2 or program_name(tokens[0]) is None:
      continue
    found.append(_make_command(path, number, span, {}, True, heading))
  return found


def doc_commands(paths=DOCS):
  """Every command of README.md and docs/*.md, in file order."""
  found = []
  for path in paths:
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
      lines = f.read().split("\n")
    heading, block, language, start = "", None, "", 0
    for i, line in enumerate(lines):
      if line.lstrip().startswith("```"):
        if block is None:
          block, language, start = [], line.strip()[3:].strip(), i + 2
        else:
          if _is_shell_block(language, block):
            found += _block_commands(path, start, language, block, heading,
                                     lines[i + 1:])
          block = None
        continue
      if block is not None:
        block.append(line)
        continue
      if line.startswith("#"):
        heading = line.lstrip("#").strip()
      found += _inline_commands(path, i + 1, line, heading)
  return found


COMMANDS = doc_commands()
