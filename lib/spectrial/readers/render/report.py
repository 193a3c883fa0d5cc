"""``spectrial report RUN_DIR``: one self-contained ``report.html`` per run record, readable offline.

The report is the run's executed notebook (``manifest.notebook``) converted with nbconvert's
``HTMLExporter`` (lab template, code hidden by default); a run without one (a CLI trial, the case
record) gets a notebook built from its manifest: a header, the arms table and the analysis sections
of :func:`spectrial.readers.explain.explain`. Either way the doctor's findings (:func:`spectrial.readers.diagnose.diagnose` on
the run folder and its logs) come first, under the title.

Offline by construction: plotly.js (``plotly.offline.get_plotlyjs()``) is inlined once in the page head,
every figure output (mimetype ``application/vnd.plotly.v1+json``) becomes a ``<div>`` drawn by
``Plotly.newPlot`` from its JSON (figures of plotly's HTML renderers keep their own call), plotly's
bootstrap outputs (require.js, CDN loaders) are dropped, external ``<script src>`` tags in HTML outputs
are removed, and the template's MathJax, require.js and mermaid loaders are left out. No ``<script src=...>``
remains (checked before writing). The manifest gains ``"report": "report.html"`` and the file is added
to its ``files``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import nbformat

from spectrial.analysis.figures import category_table
from spectrial.errors import ConfigError
from spectrial.readers.diagnose.model import Diagnosis
from spectrial.readers.render import figures as render
from spectrial.record.store import (
    Skipped,
    as_manifest,
    list_runs,
    load_record,
    load_records,
    read_requests,
    read_table,
    update_manifest,
)
from spectrial.schema import Manifest, WorkloadDescription

__all__ = ["REPORT_NAME", "build_notebook", "diagnosis_cell", "headline_cells", "latest_run", "prepare_notebook",
           "refresh_notebook", "render_html", "serving_cells", "write_report"]

REPORT_NAME = "report.html"
PLOTLY_MIME = render.PLOTLY_MIME  # the figures' mimetype (spectrial.readers.render.figure_bundle)
_SCRIPT_SRC = re.compile(r"<script\b[^>]*\bsrc\s*=", re.IGNORECASE)
_EXTERNAL_SCRIPT = re.compile(r"<script\b[^>]*\bsrc\s*=[^>]*>\s*</script>"
                              r"|<script\b[^>]*>\s*import\s+[\"']https?:[^<]*</script>", re.IGNORECASE)
_PROGRESS = re.compile(r"\d+%\||\[\d+:\d+(?::\d+)?(?:<[\d:?]+)?,\s*[^\]]*?/s")  # tqdm bars: "42%|", "[00:01, 3.2it/s"
_PLOTLY_LOADER = re.compile(r"cdn\.plot\.ly|window\.PlotlyConfig|require\.config|requirejs", re.IGNORECASE)
_ARM_COLUMNS = ["arm", "config", "status", "reason", "nccl_env", "tok_s", "tok_s_min", "tok_s_max", "n_values",
                "ms_per_token", "accept_len", "draft_accept_rate", "cycle_ms", "verify_ms", "draft_ms_per_cycle",
                "break_even_accept_len", "speedup", "speedup_ci_low", "speedup_ci_high", "verdict", "pays",
                "derived"]
_TEMPLATE_NAME = "spectrial_report.html.j2"
_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}
<script type="text/javascript">{{ resources.spectrial_plotly_js }}</script>
{%- endblock html_head_js -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block extra_css -%}
<style type="text/css">.spectrial-plotly { width: 100%; min-height: 320px; }
.jp-OutputArea-output { overflow-x: auto; } table.spectrial-compact td { white-space: nowrap; }</style>
{%- endblock extra_css -%}
"""


def _figure_html(fig: dict[str, Any], div_id: str) -> str:
    return render.figure_html(fig, div_id)  # the notebooks' own figure HTML, drawn by the plotly.js in the head


def prepare_notebook(nb: Any) -> Any:
    """A copy of an executed notebook ready for offline HTML: figure outputs drawn by the inlined
    plotly.js (``Plotly.newPlot`` from their JSON; figures of plotly's HTML renderers keep their own
    ``Plotly.newPlot`` call), plotly's bootstrap outputs and every external ``<script src>`` removed,
    progress bars dropped from stderr (its other lines, warnings included, are kept)."""
    nb = copy.deepcopy(nb)
    n = 0
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        kept = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                lines = [ln for ln in re.split(r"[\r\n]+", str(out.get("text", ""))) if ln.strip() and not _PROGRESS.search(ln)]
                if lines:
                    out["text"] = "\n".join(lines) + "\n"
                    kept.append(out)
                continue
            data = out.get("data") or {}
            if PLOTLY_MIME in data:
                n += 1
                fig = data[PLOTLY_MIME]
                title = ((fig.get("layout") or {}).get("title") or {})
                title_text = title.get("text") if isinstance(title, dict) else str(title)
                out["data"] = {"text/html": _figure_html(fig, f"spectrial-figure-{n}"),
                               "text/plain": f"<plotly figure: {title_text or n}>"}
                kept.append(out)
            elif "Plotly.newPlot" in str(data.get("text/html", "")):
                # a figure from plotly's HTML renderers: drawn by the inlined plotly.js once its loaders are gone
                data["text/html"] = _EXTERNAL_SCRIPT.sub("", str(data["text/html"]))
                kept.append(out)
            elif any(_PLOTLY_LOADER.search(str(data.get(k, ""))) for k in ("text/html", "application/javascript")):
                continue  # plotly's notebook-renderer bootstrap: needs require.js or a CDN
            else:
                if "text/html" in data:
                    data["text/html"] = _EXTERNAL_SCRIPT.sub("", str(data["text/html"]))
                kept.append(out)
        cell["outputs"] = kept
    return nb


def render_html(nb: Any, title: str, show_code: bool = False) -> str:
    """HTML of a (prepared) notebook with plotly.js inlined; raises ConfigError if any external script remains."""
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter
    from plotly.offline import get_plotlyjs

    exporter = HTMLExporter(template_name="lab", extra_loaders=[DictLoader({_TEMPLATE_NAME: _TEMPLATE})],
                            template_file=_TEMPLATE_NAME, exclude_input=not show_code,
                            exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(prepare_notebook(nb), resources={
        "metadata": {"name": title}, "spectrial_plotly_js": get_plotlyjs()})
    if _SCRIPT_SRC.search(body):
        bad = _SCRIPT_SRC.search(body)
        raise ConfigError(f"report would load an external script near {body[bad.start():bad.start() + 120]!r}: "  # type: ignore[union-attr]
                          "remove the output that carries it")
    return body


def diagnosis_cell(diagnosis: Diagnosis, manifest: Manifest | None = None) -> Any:
    """A markdown cell with the doctor's ranked findings (evidence in code spans, no raw HTML from logs), titled
    by what the record found: "Why is speculation slower here?" only when an arm is slower and none is faster."""
    import nbformat.v4 as nbf

    slower = manifest is not None and any(a.pays == "no" and a.speculative for a in manifest.arms) \
        and not any(a.verdict == "faster" for a in manifest.arms)
    title = "Why is speculation slower here? (spectrial doctor)" if slower else "What the doctor found (spectrial doctor)"
    return nbf.new_markdown_cell(f"## {title}\n\n" + diagnosis.markdown())


def headline_cells(manifest: Manifest) -> list[Any]:
    """The answer first: per headline (one per trial, per session, per sweep level) its title as a heading,
    one sentence per arm, and the compact table (rounded, units in the headers)."""
    import nbformat.v4 as nbf

    from spectrial.readers.headline import headlines

    cells = []
    for h in headlines(manifest):
        cells.append(nbf.new_markdown_cell(h.markdown(heading="##")))
        table = h.table()
        if len(table):
            cells.append(nbf.new_code_cell("", outputs=[nbf.new_output(
                "display_data", data={"text/html": table.to_html(index=False, na_rep="—", classes="spectrial-compact"),
                                      "text/plain": table.to_string(index=False)})]))
    return cells


def serving_cells(manifest: Manifest, run_dir: Path | None) -> list[Any]:
    """Serving metrics per arm (TTFT, TPOT, ITL, E2E latency p50/p90/p99, request rate, aggregate output tok/s,
    goodput) and the latency distributions from the run folder's requests (requests.csv, stream.csv)."""
    import nbformat.v4 as nbf

    from spectrial.analysis import serving
    from spectrial.readers.render.figures import figure_bundle
    from spectrial.readers.render.plots import latency_figure

    table = serving.serving_table(manifest.arms)
    if table.empty:
        return []
    notes = sorted({f"{a.name}: {n}" for a in manifest.arms if a.serving for n in a.serving.notes})
    text = ("## Serving metrics\n\nPer arm over its measured requests: time to first token, time per output "
            "token, inter-token latency (per token, pooled over every gap of every request; per delivered chunk), "
            "end-to-end latency (p50/p90/p99, ms), completed requests and output tokens per second of measurement "
            "(all streams together), and goodput (requests per second that met every SLO of `slo:`).")
    if notes:
        text += "\n\n" + "\n".join(f"- {n}" for n in notes)
    cells = [nbf.new_markdown_cell(text), nbf.new_code_cell("", outputs=[nbf.new_output(
        "display_data", data={"text/html": table.to_html(index=False, na_rep="—", classes="spectrial-compact"),
                              "text/plain": table.to_string(index=False)})])]
    if run_dir is not None:
        by_arm = read_requests(run_dir)
        if by_arm:
            fig = latency_figure(by_arm)
            cells.append(nbf.new_code_cell("", outputs=[nbf.new_output("display_data", data=figure_bundle(fig))]))
    return cells


def validity_cells(manifest: Manifest, run_dir: Path | None) -> list[Any]:
    """The measurement's checks per arm (spectrial.analysis.validity), and the accept length per request beside the
    token-weighted one, with the distribution from requests.csv."""
    import nbformat.v4 as nbf

    from spectrial.analysis.figures import accept_table
    from spectrial.analysis.validity import checks_table

    cells = []
    checks = checks_table(manifest.arms)
    if len(checks):
        bad = checks[checks["result"] == "INVALID"]
        text = ("## Is the measurement valid?\n\nLoad, queue, prefix cache, early stops, stream and start-to-start "
                "checks per arm (spectrial.analysis.validity). A failed INVALID check voids the arm's verdict.")
        if len(bad):
            text += "\n\n**Invalid:** " + "; ".join(f"{r.arm}: {r.says}" for r in bad.itertuples())
        cells += [nbf.new_markdown_cell(text), nbf.new_code_cell("", outputs=[nbf.new_output(
            "display_data", data={"text/html": checks.to_html(index=False, na_rep="—", classes="spectrial-compact"),
                                  "text/plain": checks.to_string(index=False)})])]
    acc = accept_table(manifest.arms)
    if len(acc):
        acc = acc.round(3)
        cells += [nbf.new_markdown_cell("## Accept length per request\n\nThe counters' accept length weighs every "
                                        "token the same (long completions count more); the per-request mean weighs "
                                        "every request the same."),
                  nbf.new_code_cell("", outputs=[nbf.new_output(
                      "display_data", data={"text/html": acc.to_html(index=False, na_rep="—"),
                                            "text/plain": acc.to_string(index=False)})])]
        if run_dir is not None and (run_dir / "requests.csv").exists():
            from spectrial.readers.render.figures import figure_bundle
            from spectrial.readers.render.plots import accept_len_figure

            df = read_table(run_dir / "requests.csv")
            if "accept_len" in df and "arm" in df:
                import pandas as pd

                df = df.assign(accept_len=pd.to_numeric(df["accept_len"], errors="coerce"))
                df = df[(df.get("phase", "measure") == "measure") & df["accept_len"].notna()]
                values = {str(k): g["accept_len"].tolist() for k, g in df.groupby("arm", sort=False)}
                if values:
                    fig = accept_len_figure(values, {a.name: a.accept_len for a in manifest.arms})
                    cells.append(nbf.new_code_cell("", outputs=[nbf.new_output("display_data",
                                                                               data=figure_bundle(fig))]))
    return cells


def cluster_cells(manifest: Manifest) -> list[Any]:
    """A cluster run: its units (where, how each ended and why), the speed-ups against each unit's own baseline
    pooled per fingerprint key, a sweep's best settings, what is missing. Each unit's own record has the rest."""
    import nbformat.v4 as nbf
    import pandas as pd

    from spectrial.readers.cluster import pooled_frame, units_frame

    c = manifest.cluster
    if c is None:
        return []

    def table(frame: Any) -> Any:
        return nbf.new_code_cell("", outputs=[nbf.new_output("display_data", data={
            "text/html": frame.to_html(index=False, na_rep="—", classes="spectrial-compact"),
            "text/plain": frame.to_string(index=False)})])

    text = (f"## Units ({c.executor}, at most {c.max_parallel} at once)\n\nEach unit ran its arms with its own "
            f"interleaved baseline on one host; its own record is `units/<run id>/`. Wall {c.wall_s or 0:.0f} s; "
            f"the units' own time added up: {c.unit_s or 0:.0f} s.")
    if not c.comparable:
        text += ("\n\n**Several host types** (fingerprint keys): speed-ups are pooled only within a key; "
                 "the rows of different keys are judged apart.")
    if c.missing:
        text += "\n\n**Missing:** " + "; ".join(c.missing)
    cells = [nbf.new_markdown_cell(text), table(units_frame(manifest))]
    if manifest.best:
        best = [{"fingerprint": (b.fingerprint_key or "")[:12] or None, "scenario": b.scenario,
                 "concurrency": b.concurrency, "best": b.best, "tok/s": b.tok_s, "speed-up": b.speedup,
                 "unit": b.unit, "runner-up": b.runner_up, "ratio to runner-up": b.ratio_to_runner_up}
                for b in manifest.best]
        cells += [nbf.new_markdown_cell("## Best setting\n\nPer fingerprint key, scenario and concurrency: the "
                                        "setting with the highest speed-up against its own unit's baseline (tok/s "
                                        "across units carries each host's speed), and the runner-up."),
                  table(pd.DataFrame(best).dropna(axis=1, how="all").round(4))]
    pooled = pooled_frame(manifest).dropna(axis=1, how="all")
    if len(pooled):
        cells += [nbf.new_markdown_cell("## Speed-up against each unit's own baseline\n\nOne unit's as it is; "
                                        "several units of one fingerprint key pooled on the log scale by inverse "
                                        "variance."), table(pooled.round(4))]
    return cells


def build_notebook(source: Manifest | Mapping[str, Any], diagnosis: Diagnosis | None = None,
                   run_dir: Path | None = None) -> Any:
    """A notebook with outputs built from a manifest: header, the headline, the doctor's findings (`diagnosis`,
    default: the manifest's own, without logs), serving metrics, arms table, the explain sections."""
    import nbformat.v4 as nbf

    from spectrial.analysis.figures import filled
    from spectrial.readers.diagnose import diagnose

    manifest = as_manifest(source)
    host, engine = manifest.host, manifest.engine
    head = [f"# Run `{manifest.run_id}`: {manifest.name}", "",
            f"- kind: {manifest.kind}; status: **{manifest.status}**"
            + (f" ({manifest.reason})" if manifest.reason else ""),
            f"- host: {host.name or 'n/a'}; engine: {engine.name or 'n/a'} {engine.version or ''}",
            f"- started: {manifest.started_at or 'not recorded'}; finished: "
            f"{manifest.finished_at or 'not recorded'}"]
    if manifest.workload is not None:
        head.append(f"- workload: {workload_line(manifest.workload)}")
    if manifest.get("description"):
        head += ["", str(manifest.get("description"))]
    if manifest.cluster is not None:  # the merged record of units: each unit's own record has its report
        nb = nbf.new_notebook(cells=[nbf.new_markdown_cell("\n".join(head)), *cluster_cells(manifest)])
        nb.metadata["title"] = f"spectrial report: {manifest.run_id}"
        return nb
    cells = [nbf.new_markdown_cell("\n".join(head)), *headline_cells(manifest),
             diagnosis_cell(diagnosis or diagnose(manifest), manifest), *validity_cells(manifest, run_dir),
             *serving_cells(manifest, run_dir)]
    arms = [filled(a) for a in manifest.arms]
    if arms:
        cells.append(nbf.new_markdown_cell("## Arms (every figure)"))
        cells.append(_arms_table_cell(manifest))
    cats = category_table(arms)
    if len(cats):
        cats = cats.dropna(axis=1, how="all").round(3)
        cells.append(nbf.new_markdown_cell("## Per workload category\n\nThe same arms over the requests of each "
                                           "category of the workload; speed-up and verdict against the baseline's "
                                           "requests of the same category."))
        cells.append(nbf.new_code_cell("", outputs=[nbf.new_output(
            "display_data", data={"text/html": cats.to_html(index=False, na_rep="—"),
                                  "text/plain": cats.to_string(index=False)})]))
    cells += context_cells(manifest)
    cells += analysis_cells(manifest)
    nb = nbf.new_notebook(cells=cells)
    nb.metadata["title"] = f"spectrial report: {manifest.run_id}"
    return nb


def context_cells(manifest: Manifest) -> list[Any]:
    """Each speculative arm across the workload's context buckets: the reader's lines and the figure."""
    import nbformat.v4 as nbf

    from spectrial.readers.context import context_curves
    from spectrial.readers.render.figures import figure_bundle
    from spectrial.readers.render.plots import context_figure

    curves = context_curves(manifest)
    if not curves:
        return []
    text = ("## Across context lengths\n\nEach bucket of `workload[].prompt_tokens` was measured in its own window "
            "of every start; accept length from the bucket's requests (or its windows' counters), speed-up "
            "against the baseline's same bucket.\n\n" + "\n".join(f"- {c.text()}" for c in curves))
    return [nbf.new_markdown_cell(text), nbf.new_code_cell("", outputs=[nbf.new_output(
        "display_data", data=figure_bundle(context_figure(curves)))])]


def _arms_table_cell(manifest: Manifest) -> Any:
    """Every figure of every arm (the history's rows of the record: its own comparison), rounded."""
    import nbformat.v4 as nbf

    from spectrial.readers.history import record_rows, rows_frame

    frame = rows_frame(record_rows(manifest, str(manifest.run_id))[0])
    table = frame[[c for c in _ARM_COLUMNS if c in frame.columns]].dropna(axis=1, how="all").round(3)
    return nbf.new_code_cell("", outputs=[nbf.new_output(
        "display_data", data={"text/html": table.to_html(index=False, na_rep="—"),
                              "text/plain": table.to_string(index=False)})])


def analysis_cells(manifest: Manifest, target_tok_s: float | None = None, heading: bool = True) -> list[Any]:
    """The explain sections of a record (one analysis per load level of a sweep, per session of a hand-made record
    that has several)."""
    import nbformat.v4 as nbf

    from spectrial.analysis.figures import filled
    from spectrial.readers.explain import explain
    from spectrial.readers.render.figures import explanation_cells

    arms = [filled(a) for a in manifest.arms]
    sessions = list(dict.fromkeys(a.session for a in arms if a.session is not None))
    cells: list[Any] = []
    levels = list(dict.fromkeys((a.get("concurrency"), a.get("offered_rate")) for a in arms)) if manifest.points \
        else []
    if len(levels) > 1:  # a sweep: each load level against its own baseline (one analysis per level)
        for c, rate in levels:
            cells.append(nbf.new_markdown_cell(f"## Analysis: {f'concurrency {c}' if rate is None else f'{rate:g} req/s'}"))
            cells += explanation_cells(explain(manifest.model_copy(update={"arms": [
                a for a in arms if (a.get("concurrency"), a.get("offered_rate")) == (c, rate)]}),
                target_tok_s=target_tok_s))
        return cells
    if len(sessions) > 1:
        for session in sessions:
            cells.append(nbf.new_markdown_cell(f"## Analysis: session {session}"))
            cells += explanation_cells(explain(manifest.model_copy(update={"arms": [a for a in arms
                                                                                 if a.session == session]}),
                                               target_tok_s=target_tok_s))
        return cells
    if heading:
        cells.append(nbf.new_markdown_cell("## Analysis"))
    return cells + explanation_cells(explain(manifest.model_copy(update={"arms": arms}), target_tok_s=target_tok_s))


# the calls of a trial's executed notebook (02, any version) that show its whole record's comparison, matched in a
# code cell's source; a notebook that analyses something else (a session, another record) is left as executed
_RUN = r"(?:trial|result)"
_ANALYSIS = re.compile(rf"\bexplain\({_RUN}\.manifest\b|\btrial\.explain\(")
_DOCTOR = re.compile(rf"\bdiagnose\({_RUN}\.run_dir\)")
_ANSWER = re.compile(rf"\bheadline\({_RUN}\.manifest\)|\bnarrative\.verdict\({_RUN}\.arms\)")
_FIGURES = re.compile(rf"\bbreak_even_figure\({_RUN}\.(?:manifest\.)?arms\)")
_TABLES = re.compile(r"\btrial\.compare\(\)|\bresult\.table\(\)|\btrial\.table_of\(")


def refresh_notebook(nb: Any, manifest: Manifest, diagnosis: Diagnosis | None = None) -> Any:
    """A copy of a trial's executed notebook whose cells that show the record's comparison (the analysis, the answer
    or verdict, the doctor, the arms tables, the break-even figure: calls on the trial's whole record) carry what
    spectrial's readers make of the record now; its other outputs are kept as executed. A notebook run by an older
    spectrial, or before its record was re-derived (a decide run's speed-up, a clock), would otherwise say other
    numbers than the record beside them: the report has one voice, the record's."""
    import nbformat.v4 as nbf

    from spectrial.readers.headline import headlines
    from spectrial.readers.render import plots
    from spectrial.readers.render.figures import figure_bundle

    nb = copy.deepcopy(nb)
    target = ((nb.metadata.get("papermill") or {}).get("parameters") or {}).get("target_tok_s")
    target = float(target) if isinstance(target, int | float) and not isinstance(target, bool) else None

    def code(*outputs: Any) -> Any:
        return nbf.new_code_cell("", outputs=list(outputs))

    def shown(data: dict[str, Any]) -> Any:
        return nbf.new_output("display_data", data=data)

    cells: list[Any] = []
    for cell in nb.cells:
        src = str(cell.get("source", "")) if cell.get("cell_type") == "code" else ""
        if not src or not cell.get("outputs"):
            cells.append(cell)
        elif _ANALYSIS.search(src):
            cells += analysis_cells(manifest, target, heading=False)
        elif _DOCTOR.search(src):
            from spectrial.readers.diagnose import diagnose

            cells.append(nbf.new_markdown_cell((diagnosis or diagnose(manifest)).markdown()))
        elif _ANSWER.search(src):
            for h in headlines(manifest):
                cells.append(nbf.new_markdown_cell(h.markdown()))
                if "decide_figure(" in src and manifest.decide is not None:
                    cells.append(code(shown(figure_bundle(plots.decide_figure(manifest.decide)))))
                table = h.table()
                if ".table(" in src and len(table):
                    cells.append(code(shown({"text/html": table.to_html(index=False, na_rep="—",
                                                                        classes="spectrial-compact"),
                                             "text/plain": table.to_string(index=False)})))
        elif _FIGURES.search(src):
            figs = [plots.tok_s_figure(manifest.arms)] if "tok_s_figure(" in src else []
            cells.append(code(*(shown(figure_bundle(f)) for f in [*figs, plots.break_even_figure(manifest.arms)])))
        elif _TABLES.search(src):
            cells.append(_arms_table_cell(manifest))
        else:
            cells.append(cell)
    nb.cells = cells
    return nb


def workload_line(wl: WorkloadDescription) -> str:
    """One line of what a run's requests asked: sources and sizes, categories, format, sampling, lengths."""
    srcs = ", ".join(f"{x.source} ({x.items} items)" for x in wl.sources)
    cats = ", ".join(f"{k} {v}" for k, v in wl.categories.items())
    samp = wl.sampling
    how = "greedy" if samp.get("greedy", True) else f"temperature {samp.get('temperature')}, top_p {samp.get('top_p')}"
    return (f"{srcs}; categories: {cats}; {wl.request_format or 'completion'} requests to "
            f"{wl.endpoint or '?'}; {how}; output length {wl.output_len}; seed {wl.seed}")


def latest_run(output_dir: str | Path = "outputs", skipped: list[Skipped] | None = None) -> Path:
    """The most recently started run under ``output_dir`` (by the manifest's ``started_at``; records
    without one, such as the case record, never count as newest). Damaged records are left out, each added to
    `skipped` (which and why) when given; ConfigError when no readable record is left."""
    runs = list_runs(output_dir)
    if not runs:
        raise ConfigError(f"no run record (manifest.json) under {output_dir}: run a trial first")
    started: dict[Path, str] = {}
    damaged: list[Skipped] = []
    for run, m, skip in load_records(runs):
        if m is not None:
            started[run] = str(m.started_at or "")
        elif skip is not None:
            damaged.append(skip)
    if skipped is not None:
        skipped.extend(damaged)
    if not started:
        raise ConfigError(f"no readable run record under {output_dir}: every one of the {len(runs)} is damaged ("
                          + "; ".join(f"{s.error.path}: {s.error.problem}" for s in damaged[:3])
                          + ("; ..." if len(damaged) > 3 else "") + ")",
                          hint="restore the files from a copy, or give RUN_DIR of a readable record")
    return max(started, key=lambda r: (started[r], r.name))


def write_report(run_dir: str | Path, *, show_code: bool = False) -> Path:
    """Write ``RUN_DIR/report.html`` (from the executed notebook, else from the manifest) and link it
    from the manifest (``"report": "report.html"``); returns the report's path."""
    run = Path(run_dir).expanduser()
    if not (run / "manifest.json").is_file():
        raise ConfigError(f"RUN_DIR {run} holds no manifest.json: pass a run folder, e.g. outputs/<run-id>")
    manifest = load_record(run)  # a damaged record: RecordDamaged (the file and what is wrong), nothing written
    from spectrial.readers.diagnose import diagnose

    found = diagnose(run)
    nb_name = manifest.notebook
    nb_path = run / nb_name if nb_name else None
    if nb_path is not None and nb_path.is_file():
        nb = refresh_notebook(nbformat.read(nb_path, as_version=4), manifest, found)
        nb.metadata["title"] = f"spectrial report: {manifest.run_id}"
        at = 1 if nb.cells and nb.cells[0].get("cell_type") == "markdown" else 0
        nb.cells[at:at] = [*headline_cells(manifest), diagnosis_cell(found, manifest), *serving_cells(manifest, run)]
        source = nb_path.name
    else:
        nb, source = build_notebook(manifest, found, run), "manifest"
    body = render_html(nb, title=f"spectrial report: {manifest.run_id}", show_code=show_code)
    out = run / REPORT_NAME
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(body, encoding="utf-8")
    tmp.replace(out)
    update_manifest(run, report=REPORT_NAME, report_source=source,
                    files=[*manifest.files, *([REPORT_NAME] if REPORT_NAME not in manifest.files else [])])
    return out
