"""Grammars of the generator's answers, for grammar-constrained decoding (`generator.constrained`).

Plain EBNF text (the dialect of xgrammar, GBNF-like: `rule ::= ...`, quoted literals, character classes, `?`, `*`,
`+`); selfplay/rollout/constrained.py compiles it for the model's tokenizer. Nothing here imports torch.

- `mutation_grammar()`: the exact three lines of generator/mutation.py (`REF n`, `EDIT ...`, `END`), with the edit
  kinds of `mutation.OPS`, the step kinds of the program grammar, and the names of the catalogue (every expression,
  key, group value and aggregate name some element type offers; constants named as the catalogue names them).
  Numbers are bounded (step and reference numbers 1-9, values of at most three digits, strings of at most eight
  characters) so that every answer the grammar accepts fits in `mutation.MAX_ANSWER_TOKENS` tokens of a byte-level
  tokenizer. Only training input kinds are offered to `type` (held-out `float` and `tup` are not). It knows the
  catalogue but not the prompt.
- `prompt_grammar(references)`: the mutation answers possible for one prompt's references: each reference number
  with exactly the edits of `mutation.possible_edits` (steps that exist, names the element type at that step has,
  constants the catalogue offers, a sink only at the end, no held-out pair of steps, no held-out input type, no
  edit that changes nothing) and, given the corpus index, no program the corpus holds already. Every answer it
  accepts compiles to a new task of the training split; what is left to the validity checks is what needs the
  sandbox (outputs, triviality, diversity, a different program with a stored program's behaviour).
- `free_grammar()`: the sections of generator/agent.py (DESCRIPTION line, SIGNATURE `def name(...)` line, CODE
  a `def` line and its body, INPUTS as JSON lists one per line, END). It fixes the shape, and the CODE's body is
  a Python subset (`python_rules`): every answer it accepts parses, bar one
  thing a context-free grammar cannot say (that CODE defines the name SIGNATURE gives), which `parse_proposal`
  still checks. Its repetitions are bounded so that an answer ends inside the token budget.
"""

from __future__ import annotations

from generator.families.catalogue import AGGREGATES, GROUP_VALUES
from generator.families.grammar import EXPR_TABLES, INPUT_NAMES, KEY_TABLES, WINDOW_AGGS, allowed_values
from generator.families.values import TYPE_NAMES, input_etype
from generator.splits import SplitConfig

# `type` targets: the input names less those of the default held-out element types (float, tup)
TRAIN_INPUTS = tuple(
    name for name, kind in INPUT_NAMES.items() if TYPE_NAMES[input_etype(kind)] not in SplitConfig().heldout_types
)


def _alt(words) -> str:
    return " | ".join(f'"{w}"' for w in sorted(set(words), key=lambda w: (-len(w), w)))


def _names(tables) -> list[str]:
    return sorted({e.name for table in tables for exprs in table.values() for e in exprs})


def _arg_names(tables) -> list[str]:
    return sorted({a for table in tables for exprs in table.values() for e in exprs for a in e.args})


def _string_chars() -> str:
    """The characters of every string constant the catalogue offers, as the body of a character class."""
    chars = {
        c
        for table in list(EXPR_TABLES.values()) + list(KEY_TABLES.values())
        for exprs in table.values()
        for e in exprs
        for name in set(e.args) | set(e.wide)
        for v in allowed_values(e, name)
        if isinstance(v, str)
        for c in v
    } | set("abcdefghijklmnopqrstuvwxyz0123456789_")
    return "".join(sorted(chars - {"-"})) + ("-" if "-" in chars else "")  # '-' last: a literal in the class


def _literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def prompt_grammar(references, cfg=None, index=None) -> str | None:
    """EBNF of the mutation answers possible for these references, none of them a program `index` (the corpus)
    holds already; None when no edit of any is possible."""
    from generator.build import BuildConfig
    from generator.mutation import possible_edits

    return edits_grammar(possible_edits(references, cfg or BuildConfig(), index))


def edits_grammar(edits: dict, exclude=frozenset()) -> str | None:
    """EBNF of `REF r`, `EDIT e`, `END` for each reference number r and each of its edits e (`possible_edits`),
    less the (r, edit text) answers in `exclude`; None when none is left."""
    from generator.mutation import format_edit

    texts = {
        r: sorted({format_edit(e) for e in options} - {t for rr, t in exclude if rr == r})
        for r, options in edits.items()
    }
    texts = {r: t for r, t in texts.items() if t}
    if not texts:
        return None
    lines = ['root ::= "REF " (' + " | ".join(f'"{r}\\nEDIT " edit{r}' for r in sorted(texts)) + ') "\\nEND\\n"']
    for r, options in sorted(texts.items()):
        lines.append(f"edit{r} ::= " + " | ".join(_literal(t) for t in options))
    return "\n".join(lines) + "\n"


def mutation_grammar() -> str:
    """EBNF of a whole mutation answer, `REF n\nEDIT ...\nEND\n`."""
    exprs = {kind: _names([table]) for kind, table in EXPR_TABLES.items()}
    keys = _names([KEY_TABLES["sort"], KEY_TABLES["top_k"]])
    group_keys = _names([KEY_TABLES["group"]])
    args = _arg_names(list(EXPR_TABLES.values()) + list(KEY_TABLES.values()))
    return (
        "\n".join(
            [
                'root ::= "REF " digit "\\nEDIT " edit "\\nEND\\n"',
                "digit ::= [1-9]",
                'edit ::= "const " digit " " constname "=" value | "key " digit " " key args'
                ' | "expr " digit " " exprname args'
                ' | "order " digit | "type " input | "add " digit " " step | "set " digit " " step | "drop " digit'
                ' | "swap " digit " " digit | "splice " digit " " digit " " digit',
                f"input ::= {_alt(TRAIN_INPUTS)}",
                'args ::= "" | " " assign | '
                + " | ".join(
                    f'" {a}=" value " {b}=" value' for a in args for b in args if a != b
                ),  # at most two constants, never one twice
                'assign ::= argname "=" value',
                f"argname ::= {_alt(args)}",
                f"constname ::= {_alt(args + ['k', 'w'])}",  # const also sets K of take/top_k and W of window
                'value ::= "-"? [0-9] [0-9]? [0-9]? ("." [0-9] [0-9]?)? | "\\"" chars "\\""',
                'chars ::= "" | char | char char | char char char | char char char char | char char char char char char'
                " | char char char char char char char char",
                f"char ::= [{_string_chars()}]",  # every character of the catalogue's string constants
                f"exprname ::= {_alt(n for names in exprs.values() for n in names)}",
                f"key ::= {_alt(keys + group_keys)}",
                'step ::= "filter " filtername args | "map " mapname args | "sink " sinkname args'
                ' | "sort " sortkey args " " ("asc" | "desc") (" inplace")? | "top_k " sortkey args " " digit " "'
                ' ("largest" | "smallest") | "take " ("first" | "last") " " digit | "window " digit " " windowagg'
                ' | "group " groupkey " " groupvalue " " aggregate | "reverse" | "dedup"',
                f"filtername ::= {_alt(exprs['filter'])}",
                f"mapname ::= {_alt(exprs['map'])}",
                f"sinkname ::= {_alt(exprs['sink'])}",
                f"sortkey ::= {_alt(keys)}",
                f"groupkey ::= {_alt(group_keys)}",
                f"groupvalue ::= {_alt(e.name for exprs_ in GROUP_VALUES.values() for e in exprs_)}",
                f"windowagg ::= {_alt(WINDOW_AGGS)}",
                f"aggregate ::= {_alt(AGGREGATES)}",
            ]
        )
        + "\n"
    )


IDENT_START = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"
IDENT_CHARS = IDENT_START + "0123456789"
# bounds of the free format's answer, above what any procedural task writes (at most 11 statements in a body, 12
# items in an input list, 6 input lines, 58-character strings): an answer inside them ends before the token budget,
# where an unbounded one could loop on one expression or one input list until it is cut off unparsable
MAX_STATEMENTS = 16
MAX_INPUT_LINES = 8
MAX_EXPR_DEPTH = 5


def identifier_rules(keywords, rule: str = "name") -> list[str]:
    """EBNF of the identifiers that are not one of `keywords` (Python's `for`, `in`, `lambda`, ...): a trie of the
    keywords, each node a rule that either leaves the trie (any other character, then any identifier characters)
    or follows it, and ends there unless its prefix is a keyword. A grammar without negative lookahead can say "a
    name but not a keyword" only this way, and a keyword where a name belongs is a SyntaxError."""
    prefixes = {k[:i] for k in keywords for i in range(len(k) + 1)}

    def rule_of(prefix: str) -> str:
        return rule if not prefix else f"{rule}_{prefix}"

    lines = []
    for prefix in sorted(prefixes, key=lambda p: (len(p), p)):
        chars = IDENT_START if not prefix else IDENT_CHARS
        children = [c for c in chars if prefix + c in prefixes]
        others = "".join(c for c in chars if c not in children)
        alts = [f"[{others}] {rule}_rest"] + [f'"{c}" {rule_of(prefix + c)}' for c in children]
        if prefix and prefix not in keywords:
            alts.append('""')
        lines.append(f"{rule_of(prefix)} ::= " + " | ".join(alts))
    lines.append(f"{rule}_rest ::= [{IDENT_CHARS}]{{0,31}}")
    return lines


def python_rules(max_depth: int = 4, max_expr_depth: int = MAX_EXPR_DEPTH) -> list[str]:
    """EBNF of a function body in a subset of Python (`body1`, the statements one indent deep, blocks nested up to
    `max_depth` indents): assignments (to names, attributes, subscripts, tuples of them), augmented assignments,
    `return`, `pass`, expression statements, `for`, `while`, `if`/`elif`/`else`; expressions with Python's
    precedence levels (`lambda`, conditional, `or`, `and`, `not`, comparisons, arithmetic, unary), calls with
    positional then keyword arguments or one generator, attributes, subscripts and slices, list, tuple, dict and set
    displays and comprehensions, numbers without leading zeros, string literals, and names that are not keywords.
    Spacing follows the house style of the procedural families (`x = [y + 1 for y in xs if y > 0]`); repetitions
    are bounded (MAX_STATEMENTS statements in a body, four operators in a sum, three arguments more after the
    first, ...) above what any procedural task writes. Everything it accepts parses
    (`tests/generator/test_grammars.py`); what it cannot say (an undefined name, a type error) is the sandbox's to
    find."""
    import keyword

    lines = []
    for d in range(1, max_depth + 1):
        ind = '"' + "    " * d + '"'
        alts = [f'{ind} simple "\\n"']
        if d < max_depth:
            inner = f"body{d + 1}"
            alts += [
                f'{ind} "for " ctargets " in " exprlist ":\\n" {inner}',
                f'{ind} "while " expr ":\\n" {inner}',
                f'{ind} "if " expr ":\\n" {inner} ({ind} "elif " expr ":\\n" {inner}){{0,7}} ({ind} "else:\\n"'
                f" {inner})?",
            ]
        most = MAX_STATEMENTS if d == 1 else MAX_STATEMENTS // 2
        lines += [f"body{d} ::= stmt{d}{{1,{most}}}", f"stmt{d} ::= " + " | ".join(alts)]
    lines += [
        'simple ::= "return" (" " exprlist)? | "pass" | targets " = " exprlist | target augop exprlist | expr',
        'augop ::= " += " | " -= " | " *= " | " /= " | " //= " | " %= "',
        'targets ::= target (", " target){0,7}',
        'target ::= name ("." name | "[" subscript1 "]"){0,6}',
        'ctargets ::= name (", " name){0,7}',
        'exprlist ::= expr (", " expr){0,7}',
        "expr ::= expr0",
        'compop ::= " < " | " > " | " == " | " != " | " <= " | " >= " | " in " | " not in " | " is " | " is not "',
        'arop ::= " + " | " - " | " * " | " / " | " // " | " % " | " ** "',
        'lparams ::= "" | " " name (", " name){0,7}',
        'number ::= ("0" | [1-9] [0-9]{0,8}) ("." [0-9]{1,8})?',
        'string ::= "\\"" ([^"\\\\\\n\\r] | escape){0,64} "\\"" | "\'" ([^\'\\\\\\n\\r] | escape){0,64} "\'"',
        'escape ::= "\\\\" ["\'\\\\nt]',
    ]
    for d in range(max_expr_depth + 1):
        lines += expression_rules(d, max_expr_depth)
    return lines + identifier_rules(keyword.kwlist)


def expression_rules(d: int, top: int) -> list[str]:
    """The expression rules of nesting level d (`expr{d}`, `disj{d}`, ...; 0 is a statement's own level), for a
    subset nested at most `top` levels deep. A level's brackets (displays, calls, subscripts, comprehensions) and
    its recursions without brackets (`lambda`'s body, a conditional's `else`, `not`, unary minus) open the next
    level; at `top` none is left, so an expression cannot nest without end (a comprehension inside a call inside
    a subscript inside ...): its length is bounded, as a statement's count is."""
    n = d + 1
    last = d == top
    lines = [
        f"expr{d} ::= disj{d}"
        if last
        else f'expr{d} ::= "lambda" lparams ": " expr{n} | disj{d} (" if " disj{d} " else " expr{n})?',
        f'disj{d} ::= conj{d} (" or " conj{d}){{0,3}}',
        f'conj{d} ::= inv{d} (" and " inv{d}){{0,3}}',
        f"inv{d} ::= comparison{d}" if last else f'inv{d} ::= "not " inv{n} | comparison{d}',
        f"comparison{d} ::= arith{d} (compop arith{d}){{0,2}}",
        f"arith{d} ::= unary{d} (arop unary{d}){{0,4}}",
        f"unary{d} ::= primary{d}" if last else f'unary{d} ::= "-" unary{n} | primary{d}',
        f'primary{d} ::= (atom{d} | string) trailer{d}{{0,6}} | number | "True" | "False" | "None"',
        f'trailer{d} ::= "." name' if last else f'trailer{d} ::= "." name | "(" args{n} ")" | "[" subscript{n} "]"',
        f'atom{d} ::= name | "(" ")" | "[" "]" | "{{" "}}"'
        if last
        else f'atom{d} ::= name | "(" ")" | "(" expr{n} ")" | "(" expr{n} ",)" | "(" expr{n} (", " expr{n}){{1,15}} ")"'
        f' | "(" expr{n} compfor{n} ")" | "[" "]" | "[" expr{n} (", " expr{n}){{0,15}} "]"'
        f' | "[" expr{n} compfor{n} "]" | "{{" "}}" | "{{" pair{n} (", " pair{n}){{0,15}} "}}"'
        f' | "{{" pair{n} compfor{n} "}}" | "{{" expr{n} (", " expr{n}){{0,15}} "}}" | "{{" expr{n} compfor{n} "}}"',
    ]
    if d >= 1:  # what only brackets hold
        lines += [
            f'pair{d} ::= expr{d} ": " expr{d}',
            f'compfor{d} ::= (" for " ctargets " in " disj{d} (" if " disj{d}){{0,2}}){{1,2}}',
            f'args{d} ::= "" | expr{d} compfor{d} | expr{d} (", " expr{d}){{0,3}} (", " kwarg{d}){{0,3}}'
            f' | kwarg{d} (", " kwarg{d}){{0,3}}',
            f'kwarg{d} ::= name "=" expr{d}',
            f'subscript{d} ::= expr{d} | disj{d}? ":" disj{d}? (":" disj{d}?)?',
        ]
    return lines


FREE_ROOT = (
    'root ::= "DESCRIPTION: " line "\\nSIGNATURE: " def "\\nCODE:\\n" def ":\\n" body1 "INPUTS:\\n" inputs "END\\n"'
)


def _free_rules() -> list[str]:
    """The free format's rules below its root: the `def` line, the description line, the INPUTS lines (JSON lists,
    numbers and strings as `json` reads them: no leading zeros, no control characters) and the Python subset."""
    return [
        'def ::= "def " name "(" params ")" (" -> " type)?',
        'params ::= "" | param (", " param){0,7}',  # up to 8 parameters (a procedural task takes one)
        'param ::= name (": " type)?',
        # annotations nest three deep (list[tuple[int, str]]; a procedural task's one: list[int])
        'type ::= name ("[" type1 (", " type1){0,3} "]")? | "None" | "..."',
        'type1 ::= name ("[" type2 (", " type2){0,3} "]")? | "None" | "..."',
        'type2 ::= name | "None" | "..."',
        "line ::= [^\\n \\t\\r] [^\\n]{0,599}",  # a description that is not blank
        f'inputs ::= ("[" (json (", " json){{0,7}})? "]\\n"){{1,{MAX_INPUT_LINES}}}',
        'json ::= jnumber | jstring | "[" (json (", " json){0,15})? "]" | "{" (member (", " member){0,15})? "}"'
        ' | "true" | "false" | "null"',
        'member ::= jstring ": " json',
        'jnumber ::= "-"? ("0" | [1-9] [0-9]{0,8}) ("." [0-9]{1,8})?',
        'jstring ::= "\\"" ([^"\\\\\\x00-\\x1f] | "\\\\" ["\\\\/nt]){0,120} "\\""',
        *python_rules(),
    ]


def free_grammar() -> str:
    """EBNF of a whole free-format proposal (DESCRIPTION, SIGNATURE, CODE, INPUTS, END): the CODE a `def` line and
    a body in the Python subset of `python_rules`, the INPUTS lines JSON lists."""
    return "\n".join([FREE_ROOT, *_free_rules()]) + "\n"


def free_head_grammar() -> str:
    """The first of the two stages of a tied free answer (`generator.tie_signature`): DESCRIPTION and SIGNATURE,
    to the end of the SIGNATURE line."""
    return "\n".join(['root ::= "DESCRIPTION: " line "\\nSIGNATURE: " def "\\n"', *_free_rules()]) + "\n"


def free_tail_grammar(signature: str) -> str:
    """The second stage: the rest of a free answer whose SIGNATURE line gave `signature`. The CODE's `def` line
    names the function SIGNATURE names, with its parameters in its order (each with or without an annotation, with
    or without a return annotation), and each INPUTS line passes as many arguments as it takes: what
    `validity.check_signature` checks. Then the body, INPUTS and END as in `free_grammar`: together the two stages
    accept exactly the texts of `free_grammar` that pass that check. A signature `parse_signature` refuses leaves
    the rest as `free_grammar` has it (the answer is rejected at parsing whatever follows)."""
    from generator.validity import parse_signature

    tied, inputs = "def", "inputs"
    try:
        fn = parse_signature(signature)
    except ValueError:
        rules = []
    else:
        names = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        params = ' ", " '.join(f'{_literal(a)} (": " type)?' for a in names)
        tied, inputs = f'"def " {_literal(fn.name)} "(" {params} ")" (" -> " type)?', "tinputs"
        args = f'json (", " json){{{len(names) - 1}}}' if names else '""'
        rules = [f'tinputs ::= ("[" {args} "]\\n"){{1,{MAX_INPUT_LINES}}}']
    root = f'root ::= "CODE:\\n" {tied} ":\\n" body1 "INPUTS:\\n" {inputs} "END\\n"'
    return "\n".join([root, *rules, *_free_rules()]) + "\n"


# the code_io format's answer (generator/code_io_format.py): a fenced `def f(...)` in the Python subset, one to
# code_io.MAX_INPUTS `input:` lines of Python literals a task can hold (numbers, strings, True, False, None, lists,
# dicts with string keys: no tuple, no set), an optional one-line message of at most code_io.MAX_MESSAGE_CHARS
CODE_IO_ROOT = (
    'root ::= "```python\\ndef f(" params ")" (" -> " type)? ":\\n" body1 "```\\n" ("input: " pyargs "\\n"){1,10}'
    ' ("message: " message "\\n")?'
)


def code_io_grammar() -> str:
    """EBNF of a whole code_io answer (`code_io.format_proposal`'s form, what `code_io_format.parse` accepts bar
    what a context-free grammar cannot say: distinct inputs, as many arguments as `f` takes)."""
    rules = [
        CODE_IO_ROOT,
        'pyargs ::= pyval (", " pyval){0,7}',
        'pyval ::= pynumber | pystring | "True" | "False" | "None" | "[" (pyval (", " pyval){0,15})? "]"'
        ' | "{" (pystring ": " pyval (", " pystring ": " pyval){0,15})? "}"',
        'pynumber ::= "-"? ("0" | [1-9] [0-9]{0,17}) ("." [0-9]{1,17})? ("e" [+\\-] [0-9]{2,3})?',
        r"""pystring ::= "'" ([^'\\\n\r] | pyescape){0,120} "'" | "\"" ([^"\\\n\r] | pyescape){0,120} "\"" """.rstrip(),
        r"""pyescape ::= "\\" (['"\\nrt] | "x" [0-9a-f]{2} | "u" [0-9a-f]{4})""",
        r"message ::= [^\n \t\r] [^\n\r]{0,299}",
        *_free_rules(),
    ]
    return "\n".join(rules) + "\n"


# generator.format -> its grammar
GRAMMARS = {"mutation": mutation_grammar, "free": free_grammar, "code_io": code_io_grammar}
