"""Rust source as the repository's scripts read it, without a compiler."""
import re


def is_ident(c):
    return c.isalnum() or c == "_"


def blank(src):
    """The source with comments, strings and char literals replaced by
    spaces (newlines kept, so line numbers still hold)."""
    out, i, n = list(src), 0, len(src)

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            wipe(i, j)
            i = j
        elif c in "rbc" and (i == 0 or not is_ident(src[i - 1])):
            # r"..", r#".."#, br"..", cr"..", b"..", c"..", b'.'
            m = re.compile(r'(?:b|c)?r(#*)"').match(src, i)
            if m:
                end = src.find('"' + m.group(1), m.end())
                end = n if end < 0 else end + 1 + len(m.group(1))
                wipe(i, end)
                i = end
            elif src.startswith(('b"', 'c"'), i) or src.startswith("b'", i):
                i += 1  # the quote is handled on the next turn
            else:
                i += 1
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            wipe(i, j + 1)
            i = j + 1
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}') or a lifetime / label ('a).
            if i + 1 < n and src[i + 1] == "\\":
                j = i + 3  # past the escaped character, which may be a quote
                while j < n and src[j] != "'":
                    j += 1
                wipe(i, j + 1)
                i = j + 1
            elif i + 2 < n and src[i + 2] == "'":
                wipe(i, i + 3)
                i += 3
            else:
                i += 1
        else:
            i += 1
    return "".join(out)
