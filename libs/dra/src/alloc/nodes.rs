//! Node selection as the scheduler's `nodeaffinity.NodeSelector` does it:
//! terms are ORed, a term's label expressions and field expressions are
//! ANDed, an empty term is skipped, and a selector that does not parse is an
//! error (not a mismatch).

use k8s_openapi::api::core::v1::{Node, NodeSelector, NodeSelectorRequirement};

/// Whether `node` is selected by a `nodeName` / `allNodes` / `nodeSelector`
/// triple of a slice or device (`NodeMatches`): the first one set decides.
pub fn node_matches(
    node: &Node,
    node_name: Option<&str>,
    all_nodes: bool,
    selector: Option<&NodeSelector>,
) -> Result<bool, String> {
    match (node_name.filter(|n| !n.is_empty()), all_nodes, selector) {
        (Some(name), _, _) => Ok(node.metadata.name.as_deref() == Some(name)),
        (None, true, _) => Ok(true),
        (None, false, Some(selector)) => selector_matches(node, selector)
            .map_err(|e| format!("failed to parse node selector: {e}")),
        (None, false, None) => Ok(false),
    }
}

/// Whether `selector` selects `node`.
pub fn selector_matches(node: &Node, selector: &NodeSelector) -> Result<bool, String> {
    let terms: Vec<_> = selector
        .node_selector_terms
        .iter()
        .enumerate()
        .filter(|(_, t)| {
            !(t.match_expressions
                .as_deref()
                .unwrap_or_default()
                .is_empty()
                && t.match_fields.as_deref().unwrap_or_default().is_empty())
        })
        .collect();
    // Every term is parsed first: one bad term fails the whole selector.
    let mut errors = Vec::new();
    for (i, term) in &terms {
        for (j, r) in term.match_expressions.iter().flatten().enumerate() {
            if let Err(e) = check_label_requirement(r) {
                errors.push(format!("nodeSelectorTerms[{i}].matchExpressions[{j}]: {e}"));
            }
        }
        for (j, r) in term.match_fields.iter().flatten().enumerate() {
            if let Err(e) = check_field_requirement(r) {
                errors.push(format!("nodeSelectorTerms[{i}].matchFields[{j}]: {e}"));
            }
        }
    }
    if !errors.is_empty() {
        return Err(errors.join(", "));
    }
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let name = node.metadata.name.as_deref().unwrap_or_default();
    Ok(terms.iter().any(|(_, term)| {
        term.match_expressions.iter().flatten().all(|r| {
            let value = labels.get(&r.key).map(String::as_str);
            label_requirement_matches(r, value)
        }) && term.match_fields.iter().flatten().all(|r| {
            // `metadata.name` is the only field a node offers.
            let value = (r.key == "metadata.name" && !name.is_empty()).then_some(name);
            let wanted = r.values.as_deref().unwrap_or_default().first();
            match r.operator.as_str() {
                "In" => value.is_some() && value == wanted.map(String::as_str),
                _ => value != wanted.map(String::as_str),
            }
        })
    }))
}

fn check_label_requirement(r: &NodeSelectorRequirement) -> Result<(), String> {
    let values = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" | "NotIn" if values.is_empty() => {
            Err("values: for 'in', 'notin' operators, values set can't be empty".into())
        }
        "In" | "NotIn" => Ok(()),
        "Exists" | "DoesNotExist" if !values.is_empty() => {
            Err("values: values set must be empty for exists and does not exist".into())
        }
        "Exists" | "DoesNotExist" => Ok(()),
        "Gt" | "Lt" if values.len() != 1 => {
            Err("values: for 'Gt', 'Lt' operators, exactly one value is required".into())
        }
        "Gt" | "Lt" => values[0].parse::<i64>().map(|_| ()).map_err(|_| {
            "values[0]: for 'Gt', 'Lt' operators, the value must be an integer".into()
        }),
        other => Err(format!(
            "operator: Unsupported value: \"{other}\": supported values: \"In\", \"NotIn\", \"Exists\", \"DoesNotExist\", \"Gt\", \"Lt\""
        )),
    }
}

fn check_field_requirement(r: &NodeSelectorRequirement) -> Result<(), String> {
    match r.operator.as_str() {
        "In" | "NotIn" if r.values.as_deref().unwrap_or_default().len() != 1 => {
            Err("values: must have one element".into())
        }
        "In" | "NotIn" => Ok(()),
        other => Err(format!(
            "operator: Unsupported value: \"{other}\": supported values: \"In\", \"NotIn\""
        )),
    }
}

fn label_requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|w| w == v)),
        "NotIn" => !value.is_some_and(|v| values.iter().any(|w| w == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        op @ ("Gt" | "Lt") => {
            let (Some(have), Ok(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values[0].parse::<i64>(),
            ) else {
                return false;
            };
            if op == "Gt" {
                have > bound
            } else {
                have < bound
            }
        }
        _ => false,
    }
}
