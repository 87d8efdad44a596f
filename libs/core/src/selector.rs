//! Kubernetes label selectors in their string syntax (`kubectl -l`):
//! `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, joined
//! by commas — parsed into the proto's [`LabelSelector`] and matched against
//! a pod's labels. Pure: the stack-assigner's flags are parsed here, and the
//! parsed selectors travel in the log ([`ReadinessSelectorsConfigured`]).
//!
//! [`ReadinessSelectorsConfigured`]: switchyard_proto::v1::ReadinessSelectorsConfigured

use std::fmt;

use switchyard_proto::v1::{LabelSelector, LabelSelectorRequirement};

/// A selector string that is not label-selector syntax.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelectorError {
    pub selector: String,
    pub message: String,
}

impl fmt::Display for SelectorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "label selector {:?}: {} (expected comma-separated requirements such as `app.kubernetes.io/component=node-agent`, `key!=value`, `key in (a,b)`, `key notin (a,b)`, `key` or `!key`)",
            self.selector, self.message
        )
    }
}

impl std::error::Error for SelectorError {}

/// Splits at commas outside parentheses.
fn requirements(selector: &str) -> Vec<&str> {
    let (mut depth, mut start, mut parts) = (0i32, 0, Vec::new());
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&selector[start..]);
    parts
}

/// A label key as the API server accepts its characters.
pub fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_value(value: &str) -> bool {
    value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Parses a selector; the empty string is `None` (nothing to select).
pub fn parse(selector: &str) -> Result<Option<LabelSelector>, SelectorError> {
    let error = |message: String| SelectorError {
        selector: selector.to_string(),
        message,
    };
    if selector.trim().is_empty() {
        return Ok(None);
    }
    let mut parsed = LabelSelector::default();
    for part in requirements(selector) {
        let part = part.trim();
        if part.is_empty() {
            return Err(error("an empty requirement".into()));
        }
        let key_ok = |key: &str| {
            if valid_key(key) {
                Ok(key.to_string())
            } else {
                Err(error(format!("{key:?} is not a label key")))
            }
        };
        let value_ok = |value: &str| {
            if valid_value(value) {
                Ok(value.to_string())
            } else {
                Err(error(format!("{value:?} is not a label value")))
            }
        };
        let set = |key: &str, operator: &str, rest: &str| -> Result<_, SelectorError> {
            let inner = rest
                .trim()
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| error(format!("{part:?}: the values must be in parentheses")))?;
            let values = inner
                .split(',')
                .map(|v| value_ok(v.trim()))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(LabelSelectorRequirement {
                key: key_ok(key.trim())?,
                operator: operator.into(),
                values,
            })
        };
        if let Some((key, value)) = part.split_once("!=") {
            parsed.match_expressions.push(LabelSelectorRequirement {
                key: key_ok(key.trim())?,
                operator: "NotIn".into(),
                values: vec![value_ok(value.trim())?],
            });
        } else if let Some((key, value)) = part.split_once("==").or_else(|| part.split_once('=')) {
            parsed
                .match_labels
                .insert(key_ok(key.trim())?, value_ok(value.trim())?);
        } else if let Some((key, rest)) = part.split_once(" notin ") {
            parsed.match_expressions.push(set(key, "NotIn", rest)?);
        } else if let Some((key, rest)) = part.split_once(" in ") {
            parsed.match_expressions.push(set(key, "In", rest)?);
        } else if let Some(key) = part.strip_prefix('!') {
            parsed.match_expressions.push(LabelSelectorRequirement {
                key: key_ok(key.trim())?,
                operator: "DoesNotExist".into(),
                values: Vec::new(),
            });
        } else {
            parsed.match_expressions.push(LabelSelectorRequirement {
                key: key_ok(part)?,
                operator: "Exists".into(),
                values: Vec::new(),
            });
        }
    }
    Ok(Some(parsed))
}

/// Whether `selector` selects an object with `labels`.
pub fn matches<'a>(selector: &LabelSelector, labels: impl Fn(&str) -> Option<&'a str>) -> bool {
    selector
        .match_labels
        .iter()
        .all(|(k, v)| labels(k) == Some(v.as_str()))
        && selector.match_expressions.iter().all(|r| {
            let value = labels(&r.key);
            match r.operator.as_str() {
                "In" => value.is_some_and(|v| r.values.iter().any(|w| w == v)),
                "NotIn" => !value.is_some_and(|v| r.values.iter().any(|w| w == v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
}

/// One stack pod the readiness condition looks for: the selector as
/// configured and parsed (`None`: this deployment has no such pod).
#[derive(Clone, Debug, PartialEq)]
pub struct PodSelector {
    pub text: String,
    pub selector: Option<LabelSelector>,
}

impl PodSelector {
    /// From label-selector syntax.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        Ok(PodSelector {
            text: text.trim().to_string(),
            selector: parse(text)?,
        })
    }

    /// Whether a pod with these labels is selected.
    pub fn selects(&self, pod: &(impl Labelled + ?Sized)) -> bool {
        self.selector
            .as_ref()
            .is_some_and(|s| matches(s, |k| pod.label(k)))
    }
}

/// What carries labels: a pod, as the cores fold it.
pub trait Labelled {
    /// The value of the label `key`, if it has it.
    fn label(&self, key: &str) -> Option<&str>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubectl_syntax_parses_and_matches() {
        let s =
            parse("app.kubernetes.io/component=node-agent, tier in (gpu,cpu),!legacy,zone!=b,x")
                .unwrap()
                .unwrap();
        let labels = [
            ("app.kubernetes.io/component", "node-agent"),
            ("tier", "gpu"),
            ("zone", "a"),
            ("x", ""),
        ];
        let get = |k: &str| labels.iter().find(|(l, _)| *l == k).map(|(_, v)| *v);
        assert!(matches(&s, get));
        let without_x = |k: &str| get(k).filter(|_| k != "x");
        assert!(!matches(&s, without_x));
        assert_eq!(parse("").unwrap(), None);
        let err = parse("app=a,,b").unwrap_err().to_string();
        assert!(err.contains("an empty requirement"), "{err}");
        let err = parse("tier in gpu").unwrap_err().to_string();
        assert!(err.contains("parentheses"), "{err}");
    }
}
