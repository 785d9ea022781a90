"""One output layer for untrusted text (paths, names, model cards, metadata, messages that embed them): one
escaping function per sink, so a string from a file or a user never moves a terminal's cursor, retitles it,
links it (OSC 8), reverses its text (bidi), starts a line a CI runner executes (``::error::``,
``::add-mask::``, ``::stop-commands::``, ``##[``), breaks Markdown out of a code span or makes XML
ill-formed. Escapes are shown, not dropped: ESC is ``\\x1b``, U+202E is ``\\u202e``, a newline is ``\\n``.

Sinks: ``terminal`` (stdout/stderr lines, logs), ``workflow_data`` / ``workflow_property`` (GitHub Actions
workflow commands), ``markdown_code`` / ``markdown_text`` / ``markdown_fence`` (a job summary), ``xml_text``
(JUnit XML). Pure and dependency-free: the library and the CLI both import it."""
from __future__ import annotations

import re

# C0 and C1 controls with DEL; zero-width, bidi and other invisible format characters (U+00AD, U+061C,
# U+180E, U+200B-200F, U+202A-202E, U+2060-206F, U+FEFF, U+FFF9-FFFB, tags U+E0000-E007F); the line and
# paragraph separators U+2028/2029; lone surrogates (undecodable bytes of a file name).
_UNSAFE = ("\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb"
           "\ud800-\udfff\U000e0000-\U000e007f")
_UNSAFE_RE = re.compile(f"[{_UNSAFE}]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# what a GitHub runner executes: a line that starts with "::" once leading whitespace is trimmed (v2), and
# "##[" anywhere in a line (the v1 form)
_LEADING_COMMAND = re.compile(r"^(\s*):(?=:)")
_V1_COMMAND = "##["
# Markdown characters that make links, emphasis, HTML, entities, tables or code outside a code span
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#!|~&])")
# what XML 1.0 allows: #x9 | #xA | #xD | [#x20-#xD7FF] | [#xE000-#xFFFD] | [#x10000-#x10FFFF]
_XML_INVALID = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _escape_char(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    if char in _NAMED:
        return _NAMED[char]
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _escaped(text: object, keep: str = "") -> str:
    """Every unsafe character of ``str(text)`` shown as an escape, except those in ``keep``."""
    if keep:
        return _UNSAFE_RE.sub(lambda m: m.group() if m.group() in keep else _escape_char(m), str(text))
    return _UNSAFE_RE.sub(_escape_char, str(text))


def unprintable(text: object) -> tuple[int, str] | None:
    """Where the first character of ``str(text)`` that the sinks would have to escape (a control, bidi or
    invisible character) is (0-based), and that character shown escaped; None when there is none. For refusing
    such text up front."""
    found = _UNSAFE_RE.search(str(text))
    return (found.start(), _escape_char(found)) if found else None


def check_printable(key: object, value: object, flag: str) -> None:
    """A KEY=VALUE option (--metadata, --atc-hint) holds no control, bidi or invisible character, in its key or
    its value: ONNX metadata and the manifest would store it differently, and every terminal, log and CI report
    would show it escaped. Raises OptionsError naming the flag, the key and the character."""
    from .errors import OptionsError

    for what, text in (("key", key), ("value", value)):
        found = unprintable(text)
        if found is not None:
            raise OptionsError(f"{flag} {terminal(key)}: the {what} holds the control or invisible character "
                               f"{found[1]} at position {found[0] + 1}; pass printable text")


def terminal(text: object) -> str:
    """For a terminal, a log or a CI log line: controls, bidi and invisible characters escaped (a newline is
    ``\\n``, so the text never starts a line), and no workflow-command prefix left: a leading ``::`` shows its
    first colon as ``\\x3a``, ``##[`` anywhere shows ``\\x5b``."""
    out = _escaped(text)
    out = _LEADING_COMMAND.sub(r"\1\\x3a", out)
    return out.replace(_V1_COMMAND, "##\\x5b")


def workflow_data(text: object) -> str:
    """The message of a GitHub Actions workflow command (``::error ...::MESSAGE``), escaped as GitHub documents
    (``%`` ``\\r`` ``\\n`` as ``%25`` ``%0D`` ``%0A``); other controls and bidi characters shown escaped."""
    out = _escaped(text, keep="\r\n").replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return out.replace(_V1_COMMAND, "##%5B")


def workflow_property(text: object) -> str:
    """A property value of a workflow command (``file=``, ``title=``): as ``workflow_data``, and ``:`` ``,``
    as ``%3A`` ``%2C``."""
    return workflow_data(text).replace(":", "%3A").replace(",", "%2C")


def markdown_code(text: object, in_table: bool = False) -> str:
    """An inline code span that nothing inside can end: fenced by one backtick more than the longest run of
    backticks in the text, padded where the text starts or ends with a backtick or a space; newlines and
    controls escaped (a code span cannot hold a line break). ``in_table``: ``|`` escaped as GFM tables need."""
    body = _escaped(text)
    if in_table:
        body = body.replace("|", "\\|")
    longest = max((len(run) for run in re.findall("`+", body)), default=0)
    fence = "`" * (longest + 1)
    if not body or body[0] in "` " or body[-1] in "` ":
        body = f" {body} "
    return f"{fence}{body}{fence}"


def markdown_text(text: object) -> str:
    """Running Markdown text: controls and newlines escaped, and every character that would make a link, an
    image, emphasis, HTML, an entity or a table cell backslash-escaped (shown as itself)."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", _escaped(text))


def markdown_fence(text: object, info: str = "") -> list[str]:
    """A fenced code block's lines: the text's own lines kept (controls and bidi escaped), the fence one
    backtick longer than any run of backticks inside (at least three), so no line of the text can close it."""
    body = _escaped(text, keep="\n\t")
    longest = max((len(run) for run in re.findall("`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + info, *body.split("\n"), fence]


def xml_text(text: object) -> str:
    """For XML text and attribute values (JUnit): what XML 1.0 forbids (NUL, ESC, 0x01, lone surrogates,
    U+FFFE/FFFF) and the other controls and bidi characters shown escaped; newlines and tabs kept (the
    serializer escapes ``<`` ``&`` ``"``)."""
    out = _escaped(text, keep="\n\t")
    return _XML_INVALID.sub(_escape_char, out)
