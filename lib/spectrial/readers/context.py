"""Context length as a dimension (issue 40 item 2): per speculative arm of a trial whose workload has context-length
buckets (`workload[].prompt_tokens`), the accept length, per-position acceptance and speed-up per bucket, and where
acceptance collapses.

    bucket          the prompt tokens a bucket asked for (its items hold 75-100 % of it; `prompt_tokens` is the
                    mean as sent)
    accept_len      tokens committed per verify step over the bucket's requests (the record's category figure)
    speed-up        the bucket's decode rate per request over the baseline's in the same bucket, with its interval
                    (the record's category comparison: never recomputed here)
    collapses at    the first bucket whose accept-length gain (accept_len - 1) is at most half the shortest
                    bucket's: speculation yields half the extra tokens per cycle or less
    stops paying at the first bucket, above one where the interval lay wholly above 1, whose interval does not

Each figure is the record's own (`ArmRecord.categories`, spectrial.analysis.figures.category_figures); a reader only
orders the buckets and names the crossings.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from spectrial.schema import ArmRecord, CategoryRecord, Manifest, bucket_tokens

COLLAPSE_SHARE = 0.5  # the accept-length gain that is left when acceptance "collapses", as a share of the shortest's


class Bucket(BaseModel):
    """One context bucket of one arm."""

    tokens: int = Field(description="The bucket: prompt tokens asked")
    category: str
    prompt_tokens: float | None = Field(None, description="Mean prompt tokens as sent")
    requests_ok: int = 0
    tok_s: float | None = Field(None, description="Median decode rate per request, tok/s")
    accept_len: float | None = None
    per_position: list[float] | None = None
    speedup: float | None = None
    ci: tuple[float, float] | None = None
    verdict: str | None = None

    @property
    def pays(self) -> bool | None:
        return None if self.ci is None else self.ci[0] > 1.0


class ContextCurve(BaseModel):
    """One speculative arm across the context buckets."""

    arm: str
    buckets: list[Bucket] = Field(default_factory=list)
    collapses_at: int | None = Field(None, description="The first bucket whose accept-length gain is at most "
                                                       "half the shortest bucket's")
    stops_at: int | None = Field(None, description="The first bucket above a paying one that does not pay")

    def text(self) -> str:
        b = self.buckets
        if not b:
            return f"{self.arm}: no context bucket measured"
        first, last = b[0], b[-1]
        out = f"{self.arm}: accept length {_al(first)} at {first.tokens} prompt tokens"
        if len(b) > 1:
            out += f", {_al(last)} at {last.tokens}"
        if self.collapses_at is not None:
            at = next(x for x in b if x.tokens == self.collapses_at)
            out += f"; acceptance collapses at {self.collapses_at} tokens ({_al(at)})"
        elif len(b) > 1 and all(x.accept_len is not None for x in b):
            out += "; no collapse over the measured range"
        valid = [x for x in b if x.pays is not None]
        if valid and all(x.pays for x in valid):
            out += "; pays in every bucket" if len(valid) > 1 else "; pays"
        elif valid and not any(x.pays for x in valid):
            out += "; does not pay in any bucket" if len(valid) > 1 else "; does not pay"
        elif valid:
            out += f"; pays at {', '.join(str(x.tokens) for x in valid if x.pays)} tokens"
            if self.stops_at is not None:
                at = next(x for x in b if x.tokens == self.stops_at)
                out += f", stops paying at {self.stops_at} ({at.speedup:.2f}x [{at.ci[0]:.2f}, {at.ci[1]:.2f}])"  # type: ignore[index]
        return out


def _al(b: Bucket) -> str:
    return "n/a" if b.accept_len is None else f"{b.accept_len:.2f}"


def _bucket(c: CategoryRecord, tokens: int) -> Bucket:
    ci = (c.speedup_ci_low, c.speedup_ci_high) if c.speedup_ci_low is not None and c.speedup_ci_high is not None \
        else None
    return Bucket(tokens=tokens, category=c.category, prompt_tokens=c.prompt_tokens, requests_ok=c.requests_ok,
                  tok_s=c.tok_s, accept_len=c.accept_len, per_position=c.per_position, speedup=c.speedup, ci=ci,
                  verdict=c.verdict)


def curve(arm: ArmRecord) -> ContextCurve:
    """One arm's buckets, shortest first, and where its acceptance collapses and its speed-up stops paying."""
    buckets = sorted((_bucket(c, t) for c in arm.categories if (t := bucket_tokens(c.category)) is not None),
                     key=lambda b: b.tokens)
    out = ContextCurve(arm=arm.name, buckets=buckets)
    gains = [(b.tokens, b.accept_len - 1.0) for b in buckets if b.accept_len is not None]
    if len(gains) > 1 and gains[0][1] > 0:
        out.collapses_at = next((t for t, g in gains[1:] if g <= COLLAPSE_SHARE * gains[0][1]), None)
    valid = [b for b in buckets if b.pays is not None]
    for prev, b in zip(valid, valid[1:], strict=False):
        if prev.pays and not b.pays:
            out.stops_at = b.tokens
            break
    return out


def context_curves(manifest: Manifest) -> list[ContextCurve]:
    """Every speculative arm with context buckets (none when the workload has none)."""
    return [c for a in manifest.arms
            if a.method not in (None, "none") and (c := curve(a)).buckets]


def verdict_lines(manifest: Manifest) -> list[str]:
    """One line per speculative arm across the context buckets."""
    return [c.text() for c in context_curves(manifest)]
