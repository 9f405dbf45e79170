"""The parser of record: walk a tree-sitter-bash tree into the commands it would run.

The walk uses a closed vocabulary. Every node kind the walker meets must be one it models (the
`_STATEMENT`, `_WORD` and `_EXPRESSION` tables below); anything else, and any ERROR or MISSING
node, stops the walk with an `Unmodelled` error naming the construct. The caller turns that into
a denial. Nothing here decides policy: it reports what would run.

Besides the commands, the walk records for each simple command the source span of every word
(`SyntacticCommand`), so that the second parser can be compared with it word by word.
"""

from __future__ import annotations

import itertools
import re
import threading
from dataclasses import dataclass, field

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

from gateway.analysis import braces
from gateway.analysis import words as lex
from gateway.analysis.model import (
    Assignment,
    Command,
    Context,
    Expansion,
    Flag,
    Redirect,
    RedirectMode,
    Word,
)

_LANGUAGE = Language(tree_sitter_bash.language())
_local = threading.local()


def _parser() -> Parser:
    # A tree-sitter Parser is not safe to share between threads; one per thread is cheap.
    parser: Parser | None = getattr(_local, "parser", None)
    if parser is None:
        parser = Parser(_LANGUAGE)
        _local.parser = parser
    return parser


class Unmodelled(Exception):
    """The text holds something the walker does not model. `code` is a stable denial code."""

    def __init__(self, code: str, message: str, construct: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.construct = construct


@dataclass(frozen=True, slots=True)
class SyntacticCommand:
    """A simple command as written, before wrappers are unwrapped: the unit both parsers see.

    `spans` are (start, end) character offsets of each word in the analysed text. `blind` names
    the construct that hides this command from bashlex, if any (see second_opinion.py).
    """

    spans: tuple[tuple[int, int], ...]
    argv: tuple[Word, ...]
    blind: str = ""


@dataclass
class Walk:
    """Everything one walk found. `safe_backticks` are spans where a backtick is plain text."""

    commands: list[Command] = field(default_factory=list)
    syntactic: list[SyntacticCommand] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)
    loop_variables: list[str] = field(default_factory=list)
    safe_spans: list[tuple[int, int]] = field(default_factory=list)
    raw_quoted_words: list[tuple[int, int]] = field(default_factory=list)
    arithmetic_regions: list[tuple[int, int]] = field(default_factory=list)
    heredoc_bodies: list[tuple[int, int]] = field(default_factory=list)  # verified like bash
    arithmetic_texts: list[str] = field(default_factory=list)  # every $(( )), (( )), for (( ))
    expansion_assignments: list[str] = field(default_factory=list)  # ${NAME:=...}, ${NAME=...}


# Statement kinds and the context they give the commands inside them.
_STATEMENT = frozenset(
    {
        "program",
        "list",
        "pipeline",
        "redirected_statement",
        "negated_command",
        "subshell",
        "compound_statement",
        "if_statement",
        "elif_clause",
        "else_clause",
        "while_statement",
        "for_statement",
        "c_style_for_statement",
        "case_statement",
        "case_item",
        "do_group",
        "function_definition",
        "command",
        "declaration_command",
        "unset_command",
        "test_command",
        "variable_assignment",
        "variable_assignments",
        "comment",
    }
)
_WORD = frozenset(
    {
        "word",
        "string",
        "raw_string",
        "ansi_c_string",
        "translated_string",
        "concatenation",
        "simple_expansion",
        "expansion",
        "command_substitution",
        "process_substitution",
        "arithmetic_expansion",
        "number",
        "extglob_pattern",
        "regex",
        "brace_expression",
        "variable_name",
        "special_variable_name",
        "test_operator",
        "array",
        "subscript",
    }
)
_EXPRESSION = frozenset(
    {
        "binary_expression",
        "unary_expression",
        "ternary_expression",
        "postfix_expression",
        "parenthesized_expression",
    }
)
_REDIRECT = frozenset({"file_redirect", "heredoc_redirect", "herestring_redirect"})
MAX_EXPANDED_ARGV = 4096
"""The most arguments brace expansion may give one command (braces.MAX_WORDS bounds each word)."""
_FILE_REDIRECT_MODES = {
    "<": RedirectMode.READ,
    ">": RedirectMode.WRITE,
    ">|": RedirectMode.WRITE,
    ">>": RedirectMode.APPEND,
    "&>": RedirectMode.WRITE,
    "&>>": RedirectMode.APPEND,
    ">&": RedirectMode.DUP,
    "<&": RedirectMode.DUP,
    ">&-": RedirectMode.CLOSE,
    "<&-": RedirectMode.CLOSE,
}
_ASSIGNING_EXPANSION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:\[[^]]*\])?:?=")
_NAMED_FD = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")


# Every byte of a multi-byte UTF-8 character becomes `_` in the text tree-sitter parses.
_ASCII_IMAGE = bytes(range(128)) + b"_" * 128


def ascii_image(data: bytes) -> bytes:
    """The bytes tree-sitter parses: `data` with every non-ASCII byte replaced by `_`.

    tree-sitter-bash's scanner passes code points to <ctype.h> functions (`isalpha(lookahead)`),
    which is undefined above 255: glibc reads past its table and the process can segfault,
    depending on memory layout (found by hypothesis). The image keeps every byte offset, so the
    walker reads values from the original bytes; bash treats non-ASCII characters as ordinary
    word characters, as `_` is, and `_` cannot form a reserved word.
    """
    return data.translate(_ASCII_IMAGE)


def parse_tree(text: str) -> Node:
    return _parser().parse(ascii_image(text.encode("utf-8"))).root_node


class Walker:
    """One walk over one text. Use `walk(text)`."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.data = text.encode("utf-8")
        self.ascii = len(self.data) == len(text)
        self._char_at: list[int] | None = None
        self.out = Walk()
        self.continuations: list[tuple[Node, Context]] = []
        self.dropped_dash: dict[int, tuple[int, int]] = {}  # command node id -> byte span of `-`
        # words tree-sitter hung on a redirect after its target (`sort < f -u`): in bash they are
        # the command's arguments, after its own (command node id -> word nodes, in order)
        self.trailing_words: dict[int, list[Node]] = {}
        self._extra_targets: list[Node] | None = None
        self.repaired: list[tuple[int, int]] = []

    # -- positions --------------------------------------------------------------------------

    def char(self, byte_offset: int) -> int:
        if self.ascii:
            return byte_offset
        if self._char_at is None:
            table = [0] * (len(self.data) + 1)
            pos = 0
            for ci, ch in enumerate(self.text):
                width = len(ch.encode("utf-8"))
                for k in range(width):
                    table[pos + k] = ci
                pos += width
            table[len(self.data)] = len(self.text)
            self._char_at = table
        return self._char_at[byte_offset]

    def src(self, node: Node) -> str:
        return self.data[node.start_byte : node.end_byte].decode("utf-8")

    def span(self, node: Node) -> tuple[int, int]:
        return self.char(node.start_byte), self.char(node.end_byte)

    def where(self, node: Node) -> str:
        row, col = node.start_point
        return f"line {row + 1}, column {col + 1}"

    def same_line(self, nodes: list[Node]) -> None:
        """Consecutive parts of one simple command or redirect must not be split by a newline
        (other than a backslash continuation): tree-sitter can swallow a newline without an ERROR
        node and turn the next line's command into arguments (`... | uniq -c<newline>rm x`)."""
        for a, b in itertools.pairwise(nodes):
            gap = self.data[a.end_byte : b.start_byte]
            if b"\n" in gap.replace(b"\\\n", b""):
                raise Unmodelled(
                    "joined_lines",
                    f"the parser joined line {a.end_point[0] + 1} and line {b.start_point[0] + 1} into one "
                    "command; bash would run them as separate commands",
                    self.data[a.start_byte : b.end_byte].decode("utf-8", "replace")[:80],
                )

    # -- statements -------------------------------------------------------------------------

    def statement(
        self,
        node: Node,
        ctx: tuple[Context, ...],
        redirects: tuple[Redirect, ...] = (),
        blind: str = "",
    ) -> None:
        kind = node.type
        if not node.is_named:
            return  # keywords and punctuation
        if kind not in _STATEMENT:
            raise Unmodelled(
                "unsupported_construct",
                f"unsupported shell construct '{kind}' at {self.where(node)}",
                self.src(node)[:80],
            )
        handler = getattr(self, "_st_" + kind)
        handler(node, ctx, redirects, blind)

    def body(
        self,
        node: Node,
        ctx: tuple[Context, ...],
        redirects: tuple[Redirect, ...],
        blind: str,
        skip: frozenset[str] = frozenset(),
        sequence: bool = True,
    ) -> None:
        """Statements that are children of `node`, with `&` (background) and `;` noted."""
        children = [c for c in node.children if c.is_named and c.type not in skip]
        statements = [c for c in children if c.type != "comment"]
        seq = ctx + (Context.SEQUENCE,) if sequence and len(statements) > 1 else ctx
        for child in children:
            if child.type == "comment":
                self.out.safe_spans.append(self.span(child))
                continue
            nxt = child.next_sibling
            here = seq + (Context.BACKGROUND,) if nxt is not None and nxt.type == "&" else seq
            self.statement(child, here, redirects, blind)

    def _st_program(self, node: Node, ctx: tuple[Context, ...], redirects: tuple[Redirect, ...], blind: str) -> None:
        self.body(node, ctx, redirects, blind)

    def _st_comment(self, node: Node, ctx: tuple[Context, ...], redirects: tuple[Redirect, ...], blind: str) -> None:
        self.out.safe_spans.append(self.span(node))

    def _st_list(self, node: Node, ctx: tuple[Context, ...], redirects: tuple[Redirect, ...], blind: str) -> None:
        ops = [c.type for c in node.children if not c.is_named]
        if len(ops) != 1 or ops[0] not in ("&&", "||"):
            raise Unmodelled("unsupported_construct", f"unexpected list operator {ops} at {self.where(node)}")
        here = ctx + (Context.AND if ops[0] == "&&" else Context.OR,)
        for child in node.children:
            if child.is_named:
                self.statement(child, here, redirects, blind)

    def _st_pipeline(self, node: Node, ctx: tuple[Context, ...], redirects: tuple[Redirect, ...], blind: str) -> None:
        here = ctx + (Context.PIPELINE,)
        for child in node.children:
            if child.is_named:
                self.statement(child, here, redirects, blind)
            elif child.type not in ("|", "|&"):
                raise Unmodelled(
                    "unsupported_construct",
                    f"unexpected '{child.type}' in a pipeline at {self.where(child)}",
                )

    def _st_negated_command(
        self, node: Node, ctx: tuple[Context, ...], redirects: tuple[Redirect, ...], blind: str
    ) -> None:
        for child in node.children:
            if child.is_named:
                self.statement(child, ctx + (Context.NEGATED,), redirects, blind)

    def _st_subshell(self, node: Node, ctx: tuple[Context, ...], redirects: tuple[Redirect, ...], blind: str) -> None:
        self.body(node, ctx + (Context.SUBSHELL,), redirects, blind)

    def _st_do_group(self, node: Node, ctx: tuple[Context, ...], redirects: tuple[Redirect, ...], blind: str) -> None:
        self.body(node, ctx, redirects, blind)

    def _st_compound_statement(
        self, node: Node, ctx: tuple[Context, ...], redirects: tuple[Redirect, ...], blind: str
    ) -> None:
        first = node.children[0].type if node.children else ""
        if first == "((":
            self.arithmetic_command(node, ctx, redirects, blind)
        else:
            self.body(node, ctx + (Context.GROUP,), redirects, blind)

    def _st_redirected_statement(
        self, node: Node, ctx: tuple[Context, ...], redirects: tuple[Redirect, ...], blind: str
    ) -> None:
        body = node.child_by_field_name("body")
        own: list[Redirect] = []
        outer_continuations, self.continuations = self.continuations, []
        self.same_line(self.line_parts(node, body))
        self.no_touching(node.children)
        trailing: list[Node] = []
        for child in node.children:
            if child.type in _REDIRECT:
                # only a simple command takes the words after a target as arguments (after a
                # compound command bash refuses them); anything else keeps the refusal
                self._extra_targets = trailing if body is not None and body.type == "command" else None
                try:
                    own.extend(self.redirect(child, ctx, blind))
                finally:
                    self._extra_targets = None
            elif child.is_named and child != body and child.type != "comment":
                raise Unmodelled(
                    "unsupported_construct",
                    f"unexpected '{child.type}' in a redirected statement at {self.where(child)}",
                    self.src(child)[:80],
                )
        if trailing and body is not None:
            self.trailing_words[body.id] = trailing
        all_redirects = redirects + tuple(own)
        continuations, self.continuations = self.continuations, outer_continuations
        if body is not None and body.type == "command":
            nxt = body.next_sibling
            if nxt is not None and nxt.type == "heredoc_redirect":
                gap = self.data[body.end_byte : nxt.start_byte]
                if gap.strip() == b"-":
                    # tree-sitter-bash drops a lone `-` right before `<<` (python - <<'EOF')
                    at = body.end_byte + gap.index(b"-")
                    self.dropped_dash[body.id] = (at, at + 1)
                    self.repaired.append((at, at + 1))
        if continuations:
            if body is None or len(continuations) > 1:
                raise Unmodelled(
                    "unsupported_construct", f"unsupported here-document continuation at {self.where(node)}"
                )
            cont, how = continuations[0]
            self.statement(body, ctx + (how,), all_redirects, blind)
            if how is Context.PIPELINE:
                for child in cont.children:
                    if child.is_named:
                        self.statement(child, ctx + (how,), (), blind)
                    elif child.type not in ("|", "|&"):
                        raise Unmodelled("unsupported_construct", f"unexpected '{child.type}' at {self.where(child)}")
            else:
                self.statement(cont, ctx + (how,), (), blind)
            return
        if body is None:
            # `> file` alone runs no program but truncates the file: report it.
            self.emit(Command(argv=(), redirects=all_redirects, context=ctx))
            return
        before = len(self.out.commands)
        self.statement(body, ctx, all_redirects, blind)
        if self.trailing_words.pop(body.id, None):  # never silently dropped
            raise Unmodelled("unsupported_redirect", f"words after a redirect target at {self.where(node)}")
        if len(self.out.commands) == before and own:
            self.emit(Command(argv=(), redirects=all_redirects, context=ctx))

    def no_touching(self, children: list[Node]) -> None:
        """A redirect's target ends where the next word begins only if tree-sitter split one
        bash word in two (`read x <<< a[\\$\\(cmd\\)]`): bash would read them as one."""
        for a, b in itertools.pairwise(children):
            if a.type in _REDIRECT and b.type not in _REDIRECT and b.start_byte == a.end_byte and b.is_named:
                raise Unmodelled(
                    "unparsed_text",
                    f"the parser split a word at {self.where(b)}; bash reads it as one word with the redirect target",
                    self.data[a.start_byte : b.end_byte].decode("utf-8", "replace")[:80],
                )

    def line_parts(self, node: Node, body: Node | None) -> list[Node]:
        """The pieces of a redirected statement that must sit on one line: the end of its body
        (a compound body may span lines) and each redirect."""
        parts: list[Node] = []
        for child in node.children:
            if child == body:
                parts.append(_last_leaf(child))
            elif child.type in _REDIRECT:
                parts.append(child)
        return parts

    def _st_if_statement(
        self, node: Node, ctx: tuple[Context, ...], redirects: tuple[Redirect, ...], blind: str
    ) -> None:
        self.body(node, ctx + (Context.IF,), redirects, blind, sequence=False)

    _st_elif_clause = _st_do_group
    _st_else_clause = _st_do_group

    def _st_while_statement(
        self, node: Node, ctx: tuple[Context, ...], redirects: tuple[Redirect, ...], blind: str
    ) -> None:
        self.body(node, ctx + (Context.LOOP,), redirects, blind, sequence=False)

    def _st_for_statement(
        self, node: Node, ctx: tuple[Context, ...], redirects: tuple[Redirect, ...], blind: str
    ) -> None:
        here = ctx + (Context.LOOP,)
        variable = node.child_by_field_name("variable")
        if variable is not None:
            if not self.src(variable).isascii():
                raise Unmodelled("unsupported_construct", f"non-ASCII loop variable at {self.where(variable)}")
            self.out.loop_variables.append(self.src(variable))
        listed: list[Word] = []
        has_list = any(not c.is_named and c.type == "in" for c in node.children)
        for child in node.children:
            if not child.is_named or child == variable:
                continue
            if child.type == "do_group":
                if has_list:  # the list is expanded before the body runs: its globs are reads
                    self.emit(Command(argv=(), context=here, words=tuple(listed)))
                self.statement(child, here, redirects, blind)
            elif child.type == "comment":
                self.out.safe_spans.append(self.span(child))
            else:
                listed.append(self.word(child, here, blind))  # the `in` list: its substitutions run

    def _st_c_style_for_statement(
        self, node: Node, ctx: tuple[Context, ...], redirects: tuple[Redirect, ...], blind: str
    ) -> None:
        here = ctx + (Context.LOOP,)
        opened = next(c for c in node.children if c.type == "((")
        closed = next(c for c in node.children if c.type == "))")
        header = self.data[opened.end_byte : closed.start_byte].decode("utf-8").strip()
        for child in node.children:
            if not child.is_named or child.start_byte >= closed.start_byte:
                continue
            if child.type == "variable_assignment":
                self.assignment(child, here, blind)
            else:
                self.expression(child, here + (Context.ARITHMETIC,), blind)
        self.out.arithmetic_texts.append(header)
        # the header is arithmetic evaluated on every pass: report it like `(( ... ))`
        argv = (Word("((", (), "(("), Word(header, (Expansion.ARITHMETIC,), header))
        self.emit(Command(argv=argv, context=here, flags=(Flag.BUILTIN,)))
        for child in node.children:
            if child.is_named and child.start_byte >= closed.end_byte:
                if child.type == "comment":
                    self.out.safe_spans.append(self.span(child))
                else:
                    self.statement(child, here, redirects, blind)

    def _st_case_statement(
        self, node: Node, ctx: tuple[Context, ...], redirects: tuple[Redirect, ...], blind: str
    ) -> None:
        here = ctx + (Context.CASE,)
        for child in node.children:
            if not child.is_named:
                continue
            if child.type == "case_item":
                self.statement(child, here, redirects, blind)
            elif child.type == "comment":
                self.out.safe_spans.append(self.span(child))
            else:
                self.word(child, here, blind)

    def _st_case_item(self, node: Node, ctx: tuple[Context, ...], redirects: tuple[Redirect, ...], blind: str) -> None:
        for i, child in enumerate(node.children):
            if not child.is_named:
                continue
            if node.field_name_for_child(i) == "value":
                self.word(child, ctx, blind)  # patterns: their substitutions run
            elif child.type == "comment":
                self.out.safe_spans.append(self.span(child))
            else:
                self.statement(child, ctx, redirects, blind)

    def _st_function_definition(
        self, node: Node, ctx: tuple[Context, ...], redirects: tuple[Redirect, ...], blind: str
    ) -> None:
        name = node.child_by_field_name("name")
        if name is None or name.type != "word":
            raise Unmodelled("unsupported_construct", f"function without a plain name at {self.where(node)}")
        self.out.functions.append(self.src(name))
        for child in node.children:
            if child.is_named and child != name:
                if child.type in _REDIRECT:
                    redirects = redirects + tuple(self.redirect(child, ctx, blind))
                    continue
                self.statement(child, ctx + (Context.FUNCTION,), redirects, blind)

    def _st_variable_assignment(
        self, node: Node, ctx: tuple[Context, ...], redirects: tuple[Redirect, ...], blind: str
    ) -> None:
        self.emit(
            Command(
                argv=(),
                assignments=(self.assignment(node, ctx, blind),),
                redirects=redirects,
                context=ctx,
            )
        )

    def _st_variable_assignments(
        self, node: Node, ctx: tuple[Context, ...], redirects: tuple[Redirect, ...], blind: str
    ) -> None:
        assigns = tuple(self.assignment(c, ctx, blind) for c in node.children if c.type == "variable_assignment")
        if len(assigns) != sum(1 for c in node.children if c.is_named):
            raise Unmodelled("unsupported_construct", f"unexpected node among assignments at {self.where(node)}")
        self.emit(Command(argv=(), assignments=assigns, redirects=redirects, context=ctx))

    # -- simple commands ----------------------------------------------------------------------

    def _st_command(self, node: Node, ctx: tuple[Context, ...], redirects: tuple[Redirect, ...], blind: str) -> None:
        assigns: list[Assignment] = []
        own: list[Redirect] = []
        word_nodes: list[Node] = []
        self.same_line([c for c in node.children if c.type != "comment"])
        self.no_touching(node.children)
        for i, child in enumerate(node.children):
            fname = node.field_name_for_child(i)
            if child.type == "variable_assignment" and fname is None:
                assigns.append(self.assignment(child, ctx, blind))
            elif child.type in _REDIRECT:
                own.extend(self.redirect(child, ctx, blind))
            elif fname == "name":
                if child.type != "command_name" or child.named_child_count != 1:
                    raise Unmodelled("unsupported_construct", f"unexpected command name at {self.where(child)}")
                word_nodes.append(child.named_children[0])
            elif fname == "argument" or (not child.is_named and child.type == "$"):
                word_nodes.append(child)
            elif child.type == "comment":
                self.out.safe_spans.append(self.span(child))
            else:
                raise Unmodelled(
                    "unsupported_construct",
                    f"unexpected '{child.type}' in a command at {self.where(child)}",
                    self.src(child)[:80],
                )
        word_nodes += self.trailing_words.pop(node.id, [])
        self.simple(word_nodes, node, ctx, tuple(assigns), redirects + tuple(own), blind, expand_braces=True)

    def simple(
        self,
        word_nodes: list[Node],
        node: Node,
        ctx: tuple[Context, ...],
        assigns: tuple[Assignment, ...],
        redirects: tuple[Redirect, ...],
        blind: str,
        flags: tuple[Flag, ...] = (),
        expand_braces: bool = False,
    ) -> None:
        """Emit one simple command from its word nodes. Adjacent nodes (no blank between them)
        are one shell word, whatever tree-sitter made of them (e.g. `$` + `"..."`).
        `expand_braces`: a plain command's arguments are brace-expanded as bash does (braces.py;
        the second opinion still compares the words as written)."""
        dash = self.dropped_dash.get(node.id)
        groups: list[list[Node]] = []
        for w in word_nodes:
            if groups and groups[-1][-1].end_byte == w.start_byte:
                groups[-1].append(w)
            else:
                groups.append([w])
        argv: list[Word] = []
        spans: list[tuple[int, int]] = []
        for group in groups:
            end = group[-1].end_byte
            if self.data[end : end + 1] in (b"<", b">") and _NAMED_FD.fullmatch(
                self.data[group[0].start_byte : end].decode()
            ):
                # `{name}>file` opens a descriptor and assigns its number to `name` (even PATH)
                raise Unmodelled(
                    "unsupported_redirect",
                    f"named descriptor redirect at {self.where(group[0])} is not supported (it assigns a variable)",
                    self.data[group[0].start_byte : end + 1].decode(),
                )
            argv.append(self.word_group(group, ctx, blind))
            spans.append((self.char(group[0].start_byte), self.char(group[-1].end_byte)))
        if dash is not None:
            argv.append(Word("-", (), "-"))
            spans.append((self.char(dash[0]), self.char(dash[1])))
        self.out.syntactic.append(SyntacticCommand(tuple(spans), tuple(argv), blind))
        if expand_braces:
            argv = self.brace_expanded(argv, node)
        self.emit(Command(argv=tuple(argv), assignments=assigns, redirects=redirects, context=ctx, flags=flags))

    def brace_expanded(self, argv: list[Word], node: Node) -> list[Word]:
        """Each argument that is a plain brace expansion (`out/{a,b}`, `f{1..3}`) as the literal
        words bash makes of it; the command name is left as written (a brace there is refused
        as a dynamic command name)."""
        out = argv[:1]
        for w in argv[1:]:
            if w.expansions != (Expansion.BRACE,):
                out.append(w)
                continue
            try:
                out.extend(Word(v, (), w.raw) for v in braces.expand(w.raw))
            except braces.NotPlain:
                out.append(w)  # braces bash keeps as text, or quoting: known only at run time
            except braces.TooLarge as exc:
                raise Unmodelled(
                    "brace_too_large",
                    f"brace expansion {w.raw[:60]!r} at {self.where(node)} {exc}: list the words, or use a loop",
                    w.raw[:80],
                ) from None
            if len(out) > MAX_EXPANDED_ARGV:
                raise Unmodelled(
                    "brace_too_large",
                    f"brace expansions at {self.where(node)} make more than {MAX_EXPANDED_ARGV} arguments",
                )
        return out

    def _st_declaration_command(
        self, node: Node, ctx: tuple[Context, ...], redirects: tuple[Redirect, ...], blind: str
    ) -> None:
        # export / declare / typeset / local / readonly: argv is the keyword and its operands.
        word_nodes = [c for c in node.children if c.type not in _REDIRECT and c.type != "comment"]
        own = [r for c in node.children if c.type in _REDIRECT for r in self.redirect(c, ctx, blind)]
        self.simple(word_nodes, node, ctx, (), redirects + tuple(own), blind, (Flag.BUILTIN,))

    _st_unset_command = _st_declaration_command

    def _st_test_command(
        self, node: Node, ctx: tuple[Context, ...], redirects: tuple[Redirect, ...], blind: str
    ) -> None:
        # [ ... ] and [[ ... ]]: argv is the brackets and the leaves of the test expression.
        leaves: list[Node] = []
        self.test_leaves(node, leaves)
        is_double = node.children[0].type == "[["
        self.simple(
            leaves,
            node,
            ctx,
            (),
            redirects,
            blind or ("[[ ]]" if is_double else ""),
            (Flag.BUILTIN,),
        )

    def test_leaves(self, node: Node, out: list[Node]) -> None:
        for child in node.children:
            if child.type in _EXPRESSION:
                self.test_leaves(child, out)
            elif child.type in _WORD or not child.is_named:
                out.append(child)
            elif child.type == "comment":
                continue
            else:
                raise Unmodelled(
                    "unsupported_construct",
                    f"unexpected '{child.type}' in a test at {self.where(child)}",
                )

    def arithmetic_command(
        self, node: Node, ctx: tuple[Context, ...], redirects: tuple[Redirect, ...], blind: str
    ) -> None:
        inner_text = self.data[node.children[0].end_byte : node.children[-1].start_byte].decode("utf-8")
        depth = 0
        for ch in inner_text:
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth < 0:
                break
        if depth != 0 or node.children[-1].type != "))":
            # bash reads `((a)|(b))` as two subshells, not arithmetic
            raise Unmodelled(
                "ambiguous_arithmetic",
                f"'((' at {self.where(node)} could be arithmetic or nested subshells; "
                "write '( (' for subshells or balance the parentheses",
                self.src(node)[:80],
            )
        self.out.arithmetic_regions.append(self.span(node))
        here = ctx + (Context.ARITHMETIC,)
        for child in node.children:
            if child.is_named:
                self.expression(child, here, blind or "(( ))")
        expr = self.data[node.children[0].end_byte : node.children[-1].start_byte].decode("utf-8")
        self.out.arithmetic_texts.append(expr)
        argv = (Word("((", (), "(("), Word(expr.strip(), (Expansion.ARITHMETIC,), expr))
        self.emit(Command(argv=argv, redirects=redirects, context=ctx, flags=(Flag.BUILTIN,)))

    # -- pieces ---------------------------------------------------------------------------------

    def emit(self, command: Command) -> None:
        self.out.commands.append(command)

    def assignment(self, node: Node, ctx: tuple[Context, ...], blind: str) -> Assignment:
        name_node = node.child_by_field_name("name")
        value_node = node.child_by_field_name("value")
        if name_node is None:
            raise Unmodelled("unsupported_construct", f"assignment without a name at {self.where(node)}")
        if not self.src(name_node).split("[", 1)[0].isascii():
            # tree-sitter parses an ASCII image, where `é=1` looks like an assignment; to bash a
            # non-ASCII name is no identifier, so `é=1 cmd` runs the program `é=1`
            raise Unmodelled(
                "unsupported_construct",
                f"non-ASCII variable name at {self.where(name_node)}: bash does not take it as an assignment",
                self.src(node)[:80],
            )
        if name_node.type == "subscript":
            self.word(name_node, ctx, blind)  # a[$(cmd)]=x runs cmd
        elif name_node.type != "variable_name":
            raise Unmodelled("unsupported_construct", f"unexpected assignment target at {self.where(name_node)}")
        op = next((c.type for c in node.children if not c.is_named), "=")
        if op not in ("=", "+="):
            raise Unmodelled(
                "unsupported_construct",
                f"unexpected assignment operator '{op}' at {self.where(node)}",
            )
        if value_node is None:
            value = Word("", (), "")
        else:
            # everything after the operator is the value, possibly several adjacent nodes
            parts = [c for c in node.children if c.start_byte >= value_node.start_byte]
            value = self.word_group(parts, ctx, blind, assignment=True)
        return Assignment(self.src(name_node), value, append=op == "+=")

    def redirect(self, node: Node, ctx: tuple[Context, ...], blind: str) -> list[Redirect]:
        if node.type == "herestring_redirect":
            targets = [c for c in node.children if c.is_named]
            if len(targets) != 1:
                raise Unmodelled("unsupported_construct", f"unexpected here-string at {self.where(node)}")
            return [Redirect(RedirectMode.HERESTRING, self.word(targets[0], ctx, blind), self.fd_of(node))]
        if node.type == "heredoc_redirect":
            return self.heredoc(node, ctx, blind)
        op = ""
        destinations: list[Node] = []
        fd: int | None = None
        self.same_line(list(node.children))
        for i, child in enumerate(node.children):
            fname = node.field_name_for_child(i)
            if fname == "descriptor":
                fd = self.parse_fd(child)
            elif fname == "destination":
                destinations.append(child)
            elif not child.is_named:
                op = child.type
            else:
                raise Unmodelled(
                    "unsupported_construct",
                    f"unexpected '{child.type}' in a redirect at {self.where(child)}",
                )
        if op not in _FILE_REDIRECT_MODES:
            raise Unmodelled(
                "unsupported_construct",
                f"unsupported redirect operator '{op}' at {self.where(node)}",
                self.src(node),
            )
        mode = _FILE_REDIRECT_MODES[op]
        if mode is RedirectMode.CLOSE:
            if destinations:
                raise Unmodelled("unsupported_construct", f"unexpected target after '{op}' at {self.where(node)}")
            return [Redirect(mode, None, fd)]
        if len(destinations) > 1 and self._extra_targets is not None:
            # `sort < notes.txt -u`: bash takes one word as the target and the rest as the
            # command's arguments; tree-sitter hangs them all on the redirect. (A `{fd}` among
            # them, glued to the next redirect, is still refused where the words are read.)
            self._extra_targets.extend(destinations[1:])
            destinations = destinations[:1]
        if len(destinations) != 1:
            # e.g. `{fd}>file`, which tree-sitter glues onto the previous redirect
            raise Unmodelled(
                "unsupported_redirect",
                f"redirect with {len(destinations)} targets at {self.where(node)} "
                "(named descriptors like {fd}> are not supported)",
                self.src(node),
            )
        target = self.word(destinations[0], ctx, blind)
        if op in (">&", "<&") and target.literal and not target.value.isdigit() and target.value != "-":
            # `>& file` is `&> file` in bash: a write to a file, not a dup
            if op == "<&":
                raise Unmodelled(
                    "unsupported_redirect",
                    f"'<&' needs a descriptor at {self.where(node)}",
                    self.src(node),
                )
            return [Redirect(RedirectMode.WRITE, target, fd, both=fd is None)]
        if mode is RedirectMode.DUP and not target.literal:
            # `>&$fd` may name a file at run time
            mode = RedirectMode.WRITE if op == ">&" else RedirectMode.READ
        return [Redirect(mode, target, fd, both=op in ("&>", "&>>"))]

    def heredoc(self, node: Node, ctx: tuple[Context, ...], blind: str) -> list[Redirect]:
        start = body = end = None
        op = ""
        extra: list[Redirect] = []
        strip_tabs = False
        fd = self.fd_of(node)
        for index, child in enumerate(node.children):
            if child.type == "heredoc_start":
                start = child
            elif child.type == "heredoc_body":
                body = child
            elif child.type == "heredoc_end":
                end = child
            elif child.type == "<<-":
                strip_tabs = True
            elif child.type in _REDIRECT:
                extra.extend(self.redirect(child, ctx, blind))
            elif child.type == "pipeline":
                # `cat <<EOF | cmd`: tree-sitter hangs the rest of the pipeline off the redirect
                self.continuations.append((child, Context.PIPELINE))
            elif child.type in ("&&", "||"):
                op = child.type
            elif node.field_name_for_child(index) == "right" and op:
                self.continuations.append((child, Context.AND if op == "&&" else Context.OR))
                op = ""
            elif child.type in ("<<", "file_descriptor"):
                continue
            else:
                raise Unmodelled(
                    "unsupported_construct",
                    f"unsupported construct after a here-document start at {self.where(child)} "
                    "(put the here-document's command on its own, e.g. `cat <<'EOF' > file`)",
                    self.src(child)[:80],
                )
        if start is None or end is None:
            raise Unmodelled("unsupported_construct", f"incomplete here-document at {self.where(node)}")
        delimiter, quoted = lex.heredoc_delimiter(self.src(start))
        if self.src(end) != delimiter:
            raise Unmodelled(
                "heredoc_mismatch",
                f"here-document ends with '{self.src(end)}', expected '{delimiter}'",
            )
        body_text = self.src(body) if body is not None else ""
        # Where bash starts the body: right after the newline that ends the redirect's line.
        line_end = self.data.find(b"\n", start.end_byte)
        first = body if body is not None else end
        lead = self.data[line_end + 1 : first.start_byte] if line_end >= 0 else b""
        # tree-sitter starts the body after its leading empty lines; those cannot end it
        if not delimiter:
            raise Unmodelled("heredoc_mismatch", f"here-document with an empty delimiter at {self.where(node)}")
        if line_end < 0 or first.start_byte < line_end + 1 or lead.strip(b"\t\n" if strip_tabs else b"\n"):
            raise Unmodelled(
                "heredoc_mismatch",
                f"here-document at {self.where(node)} does not start on the line after its redirect",
            )
        # Where bash ends it: the first line equal to the delimiter, after joining
        # backslash-newlines in an unquoted body (`E\<newline>OF` ends a body at EOF).
        lines = (body_text if quoted else lex.join_continuations(body_text)).split("\n")
        for line in lines:
            if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                raise Unmodelled(
                    "heredoc_mismatch",
                    f"here-document body holds its delimiter '{delimiter}' on a line of its own; "
                    "bash would end it there",
                )
        if body is not None:
            self.out.heredoc_bodies.append(self.span(body))
        if quoted or body is None:
            if body is not None:
                self.out.safe_spans.append(self.span(body))
            value = Word(body_text, (), body_text)
        else:
            value = self.heredoc_body(body, ctx, blind)
        return [Redirect(RedirectMode.HEREDOC, value, fd), *extra]

    def heredoc_body(self, body: Node, ctx: tuple[Context, ...], blind: str) -> Word:
        parts: list[str] = []
        kinds: set[Expansion] = set()
        pos = body.start_byte
        here = ctx + (Context.HEREDOC,)
        for child in body.children:
            if child.start_byte > pos:
                text, k = self.lexed(lex.heredoc_text, self.data[pos : child.start_byte].decode("utf-8"), child)
                parts.append(text)
                kinds |= k
            if child.type == "heredoc_content":
                text, k = self.lexed(lex.heredoc_text, self.src(child), child)
                parts.append(text)
                kinds |= k
            else:
                w = self.word(child, here, blind or "substitution in a here-document")
                parts.append(w.value)
                kinds |= set(w.expansions)
            pos = child.end_byte
        if pos < body.end_byte:
            text, k = self.lexed(lex.heredoc_text, self.data[pos : body.end_byte].decode("utf-8"), body)
            parts.append(text)
            kinds |= k
        return Word("".join(parts), tuple(sorted(kinds)), self.src(body))

    def fd_of(self, node: Node) -> int | None:
        for child in node.children:
            if child.type == "file_descriptor":
                return self.parse_fd(child)
        return None

    def parse_fd(self, node: Node) -> int:
        text = self.src(node)
        if not text.isdigit():
            raise Unmodelled(
                "unsupported_redirect",
                f"unsupported descriptor '{text}' at {self.where(node)}",
                text,
            )
        return int(text)

    def lexed(self, fn: object, text: str, node: Node) -> tuple[str, set[Expansion]]:
        try:
            return fn(text)  # type: ignore[operator, no-any-return]
        except lex.UnmodelledSubstitution:
            if "`" in text:
                raise Unmodelled(
                    "backtick_substitution",
                    f"backtick at {self.where(node)}: backtick substitution is not supported, use $(...) "
                    "(a literal backtick must be inside single quotes)",
                    text[:80],
                ) from None
            raise Unmodelled(
                "hidden_substitution",
                f"a command substitution at {self.where(node)} that the parser did not model",
                text[:80],
            ) from None

    # -- words ----------------------------------------------------------------------------------

    def word_group(self, nodes: list[Node], ctx: tuple[Context, ...], blind: str, assignment: bool = False) -> Word:
        """One shell word made of adjacent nodes."""
        if len(nodes) == 1 and nodes[0].type != "concatenation":
            return self.word(nodes[0], ctx, blind, assignment=assignment)
        parts: list[Node] = []
        for n in nodes:
            parts.extend(n.children if n.type == "concatenation" else [n])
        return self.concatenation(parts, nodes[0].start_byte, nodes[-1].end_byte, ctx, blind, assignment)

    def concatenation(
        self,
        parts: list[Node],
        start: int,
        end: int,
        ctx: tuple[Context, ...],
        blind: str,
        assignment: bool,
    ) -> Word:
        values: list[str] = []
        skeleton: list[str] = []
        kinds: set[Expansion] = set()
        for i, part in enumerate(parts):
            bare_dollar = part.type == "$" and not part.is_named and self.src(part) == "$"  # not `\$`
            if bare_dollar and i + 1 < len(parts) and parts[i + 1].type == "string":
                continue  # $"..." : the string part notes the translation
            if bare_dollar and part.end_byte < end:
                values.append("$")
                kinds.add(Expansion.PARAMETER)  # bash reads `$0`, `$-`, `$!` here
                skeleton.append("x")
                continue
            if part.type == "word" or (not part.is_named and part.type in ("$", "{", "}")):
                raw = self.src(part)
                text, k = self.lexed(
                    lambda t, first=(part.start_byte == start): lex.unquoted(
                        t, at_word_start=first, assignment=assignment
                    ),
                    raw,
                    part,
                )
                values.append(text)
                kinds |= k
                skeleton.append(lex.escape_mask(raw))
            else:
                w = self.word(part, ctx, blind, assignment=assignment)
                if (
                    part.type == "string"
                    and i > 0
                    and parts[i - 1].type == "$"
                    and self.src(parts[i - 1]) == "$"
                    and parts[i - 1].end_byte == part.start_byte
                ):
                    w = Word(w.value, tuple(sorted({*w.expansions, Expansion.TRANSLATION})), w.raw)
                values.append(w.value)
                kinds |= set(w.expansions)
                skeleton.append("x")
        if lex.has_brace_expansion("".join(skeleton)):
            kinds.add(Expansion.BRACE)
        raw_all = self.data[start:end].decode("utf-8")
        self.note_quoting(parts, start, end)
        return Word("".join(values), tuple(sorted(kinds)), raw_all)

    def note_quoting(self, parts: list[Node], start: int, end: int) -> None:
        quoted = sum(1 for p in parts if p.type in ("string", "raw_string", "ansi_c_string"))
        if quoted > 1 or (quoted == 1 and len(parts) > 1):
            self.out.raw_quoted_words.append((self.char(start), self.char(end)))

    def word(self, node: Node, ctx: tuple[Context, ...], blind: str, assignment: bool = False) -> Word:
        kind = node.type
        raw = self.src(node)
        if kind == "word":
            text, k = self.lexed(lambda t: lex.unquoted(t, at_word_start=True, assignment=assignment), raw, node)
            if lex.has_brace_expansion(lex.escape_mask(raw)):
                k.add(Expansion.BRACE)
            return Word(text, tuple(sorted(k)), raw)
        if not node.is_named and kind == "$":  # a lone `$` or `\$` word
            return self.concatenation([node], node.start_byte, node.end_byte, ctx, blind, assignment)
        if kind in ("number", "variable_name", "test_operator") or (
            not node.is_named and kind not in ("`", "$`", "``")
        ):
            return Word(raw, (), raw)
        if kind == "raw_string":
            self.out.safe_spans.append(self.span(node))
            return Word(raw[1:-1], (), raw)
        if kind == "ansi_c_string":
            self.out.safe_spans.append(self.span(node))
            try:
                return Word(lex.ansi_c(raw[2:-1]), (), raw)
            except lex.UnmodelledEscape as exc:
                raise Unmodelled(
                    "unsupported_escape",
                    f"$'...' escape {exc} at {self.where(node)} gives a raw byte or depends on the locale; "
                    "write the character itself",
                    raw[:80],
                ) from None
        if kind == "string" or kind == "translated_string":
            return self.string(node, ctx, blind, translated=kind == "translated_string")
        if kind == "concatenation":
            return self.concatenation(list(node.children), node.start_byte, node.end_byte, ctx, blind, assignment)
        if kind in ("simple_expansion", "special_variable_name"):
            return Word(raw, (Expansion.PARAMETER,), raw)
        if kind == "expansion":
            if raw.endswith("@P}"):
                raise Unmodelled(
                    "prompt_expansion",
                    f"${{...@P}} at {self.where(node)} expands the value as a prompt, running any "
                    "command substitution it holds",
                    raw[:80],
                )
            assigned = _ASSIGNING_EXPANSION.match(raw)
            if assigned:
                self.out.expansion_assignments.append(assigned.group(1))
            self.nested(node, ctx, blind or "command substitution inside ${...}")
            return Word(raw, (Expansion.PARAMETER,), raw)
        if kind == "command_substitution":
            if node.children and node.children[0].type != "$(":
                raise Unmodelled(
                    "backtick_substitution",
                    f"backtick command substitution at {self.where(node)}: use $(...) instead",
                    raw[:80],
                )
            self.body(node, ctx + (Context.COMMAND_SUBSTITUTION,), (), blind)
            return Word(raw, (Expansion.COMMAND_SUBSTITUTION,), raw)
        if kind == "process_substitution":
            inner = Context.PROCESS_SUBSTITUTION_IN if raw.startswith("<") else Context.PROCESS_SUBSTITUTION_OUT
            self.body(node, ctx + (inner,), (), blind)
            return Word(raw, (Expansion.PROCESS_SUBSTITUTION,), raw)
        if kind == "arithmetic_expansion":
            self.out.arithmetic_texts.append(raw)
            self.nested(node, ctx + (Context.ARITHMETIC,), blind or "$(( ))")
            return Word(raw, (Expansion.ARITHMETIC,), raw)
        if kind in ("extglob_pattern", "regex"):
            text, _ = self.lexed(lambda t: lex.unquoted(t, at_word_start=False), raw, node)
            return Word(text, (Expansion.GLOB,), raw)
        if kind == "brace_expression":
            return Word(raw, (Expansion.BRACE,), raw)
        if kind == "variable_assignment":  # an operand of export / declare / local ...
            a = self.assignment(node, ctx, blind)
            op = "+=" if a.append else "="
            return Word(a.name + op + a.value.value, a.value.expansions, raw)
        if kind == "array":
            kinds: set[Expansion] = set()
            for child in node.children:
                if child.is_named:
                    kinds |= set(self.word(child, ctx, blind).expansions)
            return Word(raw, tuple(sorted(kinds)), raw)
        if kind == "subscript":
            self.nested(node, ctx, blind)
            return Word(raw, (Expansion.PARAMETER,), raw)
        raise Unmodelled(
            "unsupported_construct",
            f"unsupported construct '{kind}' in a word at {self.where(node)}",
            raw[:80],
        )

    def string(self, node: Node, ctx: tuple[Context, ...], blind: str, translated: bool) -> Word:
        parts: list[str] = []
        kinds: set[Expansion] = {Expansion.TRANSLATION} if translated else set()
        inner = [c for c in node.children if c.type not in ('"', "$")]
        first = node.children[0]
        last = node.children[-1]
        pos = first.end_byte
        for child in inner:
            if child.start_byte > pos:
                text, k = self.lexed(lex.double_quoted, self.data[pos : child.start_byte].decode("utf-8"), child)
                parts.append(text)
                kinds |= k
            if child.type == "string_content":
                text, k = self.lexed(lex.double_quoted, self.src(child), child)
            else:
                w = self.word(child, ctx, blind)
                text, k = w.value, set(w.expansions)
            parts.append(text)
            kinds |= k
            pos = child.end_byte
        close = node.end_byte - 1  # the closing quote; tree-sitter's token can include blanks before it
        if last.type == '"' and close > pos:
            text, k = self.lexed(lex.double_quoted, self.data[pos:close].decode("utf-8"), node)
            parts.append(text)
            kinds |= k
        return Word("".join(parts), tuple(sorted(kinds)), self.src(node))

    def nested(self, node: Node, ctx: tuple[Context, ...], blind: str) -> None:
        """Find the commands inside an expansion, subscript or arithmetic expression."""
        for child in node.children:
            if not child.is_named:
                if child.type in ("`", "$`", "``"):
                    raise Unmodelled(
                        "backtick_substitution",
                        f"backtick command substitution at {self.where(child)}: use $(...) instead",
                    )
                continue
            if child.type in _EXPRESSION:
                self.expression(child, ctx, blind)
            elif child.type in _WORD:
                self.word(child, ctx, blind)
            else:
                raise Unmodelled(
                    "unsupported_construct",
                    f"unsupported construct '{child.type}' inside {node.type} at {self.where(child)}",
                    self.src(child)[:80],
                )

    def expression(self, node: Node, ctx: tuple[Context, ...], blind: str) -> None:
        if node.type in _EXPRESSION:
            self.nested(node, ctx, blind)
        elif node.type == "variable_assignment":
            self.assignment(node, ctx, blind)
        elif node.type in _WORD:
            self.word(node, ctx, blind)
        elif node.is_named:
            raise Unmodelled(
                "unsupported_construct",
                f"unsupported construct '{node.type}' in arithmetic at {self.where(node)}",
            )


def _last_leaf(node: Node) -> Node:
    while node.child_count:
        node = node.children[-1]
    return node


def first_error(root: Node) -> Node | None:
    """The first ERROR or MISSING node, in source order."""
    if not root.has_error:
        return None
    stack = [root]
    while stack:
        node = stack.pop()
        if node.is_error or node.is_missing:
            return node
        if node.has_error:
            stack.extend(reversed(node.children))
    return root


# Nodes whose whole text the walker reads itself (gaps inside them are handled as text).
_ATOMIC_FOR_COVERAGE = frozenset(
    {
        "word",
        "string",
        "raw_string",
        "ansi_c_string",
        "translated_string",
        "heredoc_body",
        "heredoc_start",
        "heredoc_end",
        "comment",
        "number",
        "regex",
        "extglob_pattern",
        "variable_name",
        "special_variable_name",
        "test_operator",
        "file_descriptor",
        "string_content",
        "heredoc_content",
    }
)
_CONTINUATION = re.compile(rb"[ \t\n]*(?:\\\n[ \t\n]*)*")


def check_coverage(data: bytes, root: Node, repaired: list[tuple[int, int]]) -> None:
    """Every non-blank byte must lie inside a node: tree-sitter can drop a token without an
    ERROR node (a lone `-` before `<<`), and a dropped word is a word nobody checked."""
    pos = 0
    stack = [root]
    leaves: list[tuple[int, int]] = list(repaired)
    while stack:
        node = stack.pop()
        if node.child_count == 0 or node.type in _ATOMIC_FOR_COVERAGE:
            leaves.append((node.start_byte, node.end_byte))
        else:
            stack.extend(reversed(node.children))
    for start, end in sorted(leaves):
        if start > pos:
            gap = data[pos:start]
            m = _CONTINUATION.fullmatch(gap)
            if m is None:
                row = data.count(b"\n", 0, pos) + 1
                raise Unmodelled(
                    "unparsed_text",
                    f"text the parser skipped at line {row}: {gap.strip().decode('utf-8', 'replace')[:40]!r}",
                    gap.decode("utf-8", "replace")[:80],
                )
        pos = max(pos, end)
    tail = data[pos:]
    if _CONTINUATION.fullmatch(tail) is None:
        raise Unmodelled("unparsed_text", f"text the parser skipped at the end: {tail.strip()[:40]!r}")


def walk(text: str) -> Walk:
    """Walk `text` with the closed vocabulary. Raises `Unmodelled` for anything outside it."""
    root = parse_tree(text)
    bad = first_error(root)
    if bad is not None:
        row, col = bad.start_point
        what = f"missing '{bad.type}'" if bad.is_missing else "syntax error"
        near = text.encode("utf-8")[bad.start_byte : bad.end_byte + 20].decode("utf-8", "replace")
        raise Unmodelled("syntax_error", f"{what} at line {row + 1}, column {col + 1}", near[:80])
    walker = Walker(text)
    walker.statement(root, ())
    check_coverage(walker.data, root, walker.repaired)
    return walker.out
