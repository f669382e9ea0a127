"""The one entry point of the benchmarks in this folder: each ``bench_<name>.py`` runs by its name.

    python benchmarks/run.py --list              # every benchmark: what it measures, ranks, time
    python benchmarks/run.py --show fit          # one benchmark's docstring (why, how to read it)
    python benchmarks/run.py loop --quick        # bench_loop.py --quick
    python benchmarks/run.py fit --control       # bench_fit.py on 2 Gloo ranks under torchrun
    python benchmarks/run.py --ranks 1 fit       # the same benchmark in one process
    python benchmarks/run.py --dry-run fit       # print the command instead of running it
    python benchmarks/run.py --new-report fit-overhead benchmarks/results/fit_ddp2-....json
                                                 # start reports/<today>-fit-overhead.md and .json

Everything after the name goes to the script unchanged. A script that sets ``LAUNCH_RANKS`` runs
under ``torch.distributed.run`` with that many processes (``--ranks`` overrides; a script argument
``--single`` means one process); the others start their own jobs or need none. The repository's
root is put on ``PYTHONPATH`` (the scripts import ``framework`` and ``recipes``).

Why a script here and not ``fw bench <name>``: ``fw bench`` is installed with fw and answers a
user's question on the user's machine (which backend and strategy to use; ``framework/bench/``,
``conf/bench/``). These scripts are the repository's own measurements: they need a checkout
(``recipes/``, the shared ``_modules.py``, their results and reports folders), some need
torchrun, mpiexec or a GPU, and fw must not import them; a subcommand would ship them in the
package or reach out of it. This runner only finds and launches them.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: the lines every benchmark's docstring holds, after its first line (what it measures)
SECTIONS = ("Why:", "Read:", "Time:", "Run:")


@dataclass(frozen=True)
class Benchmark:
    """One ``bench_<name>.py``: its name, file, docstring and how many processes it starts in."""

    name: str
    path: Path
    doc: str
    ranks: int

    @property
    def summary(self) -> str:
        """The docstring's first paragraph (what it measures), on one line."""
        return " ".join(self.doc.strip().split("\n\n")[0].split())

    def section(self, label: str) -> str:
        """The text after ``label`` (e.g. ``Time:``) up to the next section or blank line."""
        lines = self.doc.splitlines()
        for i, line in enumerate(lines):
            if line.startswith(label):
                text = [line[len(label):].strip()]
                for more in lines[i + 1:]:
                    if not more.strip() or more.startswith(SECTIONS):
                        break
                    text.append(more.strip())
                return " ".join(text)
        return ""


def benchmarks() -> dict[str, Benchmark]:
    """Every ``bench_*.py`` of this folder by name, read without importing it (no torch needed)."""
    found = {}
    for path in sorted(HERE.glob("bench_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        ranks = 1
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "LAUNCH_RANKS" for t in node.targets):
                ranks = int(ast.literal_eval(node.value))
        name = path.stem.removeprefix("bench_")
        found[name] = Benchmark(name, path, ast.get_docstring(tree) or "", ranks)
    return found


def command(bench: Benchmark, args: list[str], ranks: int | None) -> list[str]:
    """The command line that runs ``bench`` with the script arguments ``args``."""
    if ranks is None:
        ranks = 1 if "--single" in args else bench.ranks
    if ranks > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
                str(bench.path), *args]
    return [sys.executable, str(bench.path), *args]


def listing(found: dict[str, Benchmark]) -> str:
    rows = [f"{'name':<26} {'ranks':<5} what it measures; how long"]
    for bench in found.values():
        rows.append(f"{bench.name:<26} {bench.ranks:<5} {bench.summary}")
        rows.append(f"{'':<32} Time: {bench.section('Time:')}")
    rows.append("")
    rows.append("Which backend and strategy to use on this machine: fw bench (python -m framework.cli bench --help).")
    rows.append("Each one's docstring: python benchmarks/run.py --show NAME")
    return "\n".join(rows)


def new_report(topic: str, results: list[str]) -> list[Path]:
    """Start ``reports/<today>-<topic>.md`` and its ``.json`` (the results it quotes, the figures
    to fill in); refuses to overwrite a report."""
    stem = f"{datetime.date.today().isoformat()}-{topic}"
    md, numbers = HERE / "reports" / f"{stem}.md", HERE / "reports" / f"{stem}.json"
    if md.exists() or numbers.exists():
        raise SystemExit(f"run.py: {md.name} exists already; reports are not overwritten")
    quoted = [Path(r).resolve() for r in results]
    for q in quoted:
        if q.parent != HERE / "results" or not q.is_file():
            raise SystemExit(f"run.py: {q} is not a file of benchmarks/results/ (a report quotes only kept results)")
    machine = json.loads(quoted[0].read_text()).get("machine", {}) if quoted else {}
    md.write_text(f"# {topic.replace('-', ' ').capitalize()} ({stem[:10]})\n\n"
                  "What was measured and why; how (script, command, rounds); on what; what it showed.\n\n"
                  + "".join(f"- `benchmarks/results/{q.name}`\n" for q in quoted), encoding="utf-8")
    doc = {"report": md.name, "date": stem[:10], "topic": topic, "title": topic, "machine": machine,
           "scripts": [], "results": [os.path.relpath(q, md.parent) for q in quoted], "figures": {}}
    numbers.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return [md, numbers]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     usage="%(prog)s [--list | --show NAME | [--ranks N] [--dry-run] NAME [ARGS...]]")
    parser.add_argument("--list", action="store_true", help="list every benchmark and exit")
    parser.add_argument("--show", metavar="NAME", help="print one benchmark's docstring and exit")
    parser.add_argument("--ranks", type=int, default=None, help="processes to start (default: the script's LAUNCH_RANKS, or 1)")
    parser.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    parser.add_argument("--new-report", metavar="TOPIC",
                        help="start reports/<today>-TOPIC.md and .json; the arguments after it are the results it quotes")
    parser.add_argument("name", nargs="?", help="a benchmark's name (bench_<name>.py)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    opts = parser.parse_args(argv)
    found = benchmarks()
    if opts.new_report:
        for path in new_report(opts.new_report, [a for a in [opts.name, *opts.args] if a]):
            print(f"wrote {path.relative_to(ROOT)}: fill in the text and the figures")
        return 0
    if opts.list:
        print(listing(found))
        return 0
    name = opts.show or opts.name
    if name is None:
        parser.print_usage()
        return 2
    if name not in found:
        print(f"run.py: no benchmark named {name!r}; there are: {', '.join(found)}", file=sys.stderr)
        return 2
    if opts.show:
        print(found[name].doc)
        return 0
    cmd = command(found[name], opts.args, opts.ranks)
    if opts.dry_run:
        print(" ".join(cmd))
        return 0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.call(cmd, cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main())
