//! Names joined into one string, for keys held once per pod or workload:
//! one allocation where a tuple of strings takes one per name and a wider
//! slot in every B-tree node.
//!
//! Parts are separated by two NULs and a NUL inside a part is written as
//! NUL, U+0001, so the joined strings sort as the tuples of their parts do
//! (a part that is a prefix of another sorts first either way) and split
//! back into them whatever the names hold.

use std::borrow::Cow;

const SEPARATOR: &str = "\0\0";
const ESCAPED_NUL: &str = "\0\u{1}";

/// `parts` joined.
pub(crate) fn join(parts: &[&str]) -> Box<str> {
    let len = parts
        .iter()
        .map(|p| p.len() + SEPARATOR.len())
        .sum::<usize>();
    let mut joined = String::with_capacity(len.saturating_sub(SEPARATOR.len()));
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            joined.push_str(SEPARATOR);
        }
        if part.contains('\0') {
            joined.push_str(&part.replace('\0', ESCAPED_NUL));
        } else {
            joined.push_str(part);
        }
    }
    joined.into_boxed_str()
}

/// [`join`] followed by a separator: what the joined strings of `prefix`
/// and further parts start with.
pub(crate) fn prefix(prefix: &[&str]) -> String {
    let mut start = join(prefix).into_string();
    start.push_str(SEPARATOR);
    start
}

/// The parts of a joined string (or of what follows a [`prefix`]).
pub(crate) fn split(joined: &str) -> impl Iterator<Item = Cow<'_, str>> {
    joined.split(SEPARATOR).map(|part| {
        if part.contains('\0') {
            Cow::Owned(part.replace(ESCAPED_NUL, "\0"))
        } else {
            Cow::Borrowed(part)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_and_splits_as_the_tuples() {
        let names = [
            "", "a", "a\0", "a\0b", "a\u{1}", "ab", "b", "\0", "\0\0", "\u{1}",
        ];
        let mut tuples = Vec::new();
        for a in names {
            for b in names {
                for c in names {
                    tuples.push((a, b, c));
                }
            }
        }
        for (a, b, c) in &tuples {
            let joined = join(&[a, b, c]);
            let parts: Vec<_> = split(&joined).collect();
            assert_eq!(parts, [*a, *b, *c], "{joined:?}");
            let under = &joined[prefix(&[a]).len()..];
            assert_eq!(split(under).collect::<Vec<_>>(), [*b, *c], "{joined:?}");
            assert!(joined.starts_with(&prefix(&[a, b])));
        }
        let joined: Vec<_> = tuples
            .iter()
            .map(|t| (t, join(&[t.0, t.1, t.2]), prefix(&[t.0])))
            .collect();
        for (x, jx, px) in &joined {
            for (y, jy, _) in &joined {
                assert_eq!(jx.cmp(jy), x.cmp(y), "{x:?} {y:?}");
                // Another tuple's prefix only where its first parts are equal.
                assert_eq!(jy.starts_with(px.as_str()), x.0 == y.0, "{x:?} {y:?}");
            }
        }
    }
}
