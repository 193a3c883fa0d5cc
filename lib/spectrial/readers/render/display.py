"""Notebook display of what the readers wrote (a leaf: it imports nothing of spectrial)."""

from __future__ import annotations


def show_markdown(text: str) -> None:
    """Display markdown in a notebook."""
    from IPython.display import Markdown, display

    display(Markdown(text))
