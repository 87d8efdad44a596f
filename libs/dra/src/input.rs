//! Reading objects from files as the API server reads a request with strict
//! field validation: bounded before parsing, every field known.
//!
//! - [`documents`]: the YAML or JSON documents of a file as JSON values.
//!   The file's size and the nesting of its flow collections (`[`, `{`) are
//!   checked first, in one pass over the bytes: deeply nested YAML flow
//!   sequences take the YAML parser time growing with the square of the
//!   depth (200,000 levels, 418 KB: a minute), so they are refused before
//!   the parser sees them, and time and memory stay linear in the input.
//! - [`strict`]: a value as a typed object, refusing a field the type does
//!   not have (`spec.constraints` one level too high, `alocationMode`) —
//!   named by its path, as the API server names it (`unknown field
//!   "spec.devices.requests[0].exactly.alocationMode"`) — and naming the
//!   path of a field of the wrong type.

use serde::Deserialize;
use serde::de::DeserializeOwned;

/// Largest input file read (the API server takes 3 MiB per request; a
/// file may hold a cluster's worth of slices).
pub const MAX_INPUT_BYTES: usize = 32 << 20;

/// Deepest nesting of flow collections (`[` / `{`) accepted. Kubernetes
/// objects nest a dozen levels; a JSON file's objects are flow collections
/// too.
pub const MAX_NESTING: usize = 64;

/// Why a file's documents could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    #[error("{source_name}: {size} bytes; at most {MAX_INPUT_BYTES} are read")]
    TooLarge { source_name: String, size: usize },
    #[error(
        "{source_name}: line {line}: collections nested {MAX_NESTING} levels deep, the most accepted"
    )]
    TooDeep { source_name: String, line: usize },
    #[error("{source_name}: document {document} is not valid {format}: {message}")]
    Syntax {
        source_name: String,
        document: usize,
        format: &'static str,
        message: String,
    },
}

/// Checks `text`'s size and the nesting of its flow collections, without
/// parsing it. Brackets inside quoted strings and comments do not count; a
/// bracket inside a plain scalar does (at worst a pathological scalar is
/// refused, never a deep collection let through).
pub fn check_bounds(source_name: &str, text: &str) -> Result<(), ReadError> {
    if text.len() > MAX_INPUT_BYTES {
        return Err(ReadError::TooLarge {
            source_name: source_name.to_string(),
            size: text.len(),
        });
    }
    #[derive(PartialEq)]
    enum In {
        Plain,
        Single,
        Double,
        Comment,
    }
    let mut state = In::Plain;
    let mut depth = 0usize;
    let mut line = 1;
    // The byte before, for where a quote or comment may start.
    let mut before = b'\n';
    let mut escaped = false;
    for &b in text.as_bytes() {
        if b == b'\n' {
            line += 1;
            if state == In::Comment {
                state = In::Plain;
            }
        }
        match state {
            In::Comment => {}
            In::Double => {
                if escaped {
                    escaped = false;
                } else if b == b'\\' {
                    escaped = true;
                } else if b == b'"' {
                    state = In::Plain;
                }
            }
            // A quote inside a single-quoted scalar is written twice: it
            // closes and opens again, which leaves the count as it is.
            In::Single if b == b'\'' => state = In::Plain,
            In::Single => {}
            In::Plain => {
                let token_start = matches!(
                    before,
                    b' ' | b'\t' | b'\n' | b'\r' | b'[' | b'{' | b',' | b':' | b'-'
                );
                match b {
                    b'"' => state = In::Double,
                    b'\'' if token_start => state = In::Single,
                    b'#' if matches!(before, b' ' | b'\t' | b'\n' | b'\r') => state = In::Comment,
                    b'[' | b'{' => {
                        depth += 1;
                        if depth > MAX_NESTING {
                            return Err(ReadError::TooDeep {
                                source_name: source_name.to_string(),
                                line,
                            });
                        }
                    }
                    b']' | b'}' => depth = depth.saturating_sub(1),
                    _ => {}
                }
            }
        }
        before = b;
    }
    Ok(())
}

/// Every document of a file, YAML or JSON (a JSON file may hold a stream of
/// values; a top-level JSON array is its items), empty YAML documents
/// skipped. `source_name` names the file in errors.
pub fn documents(source_name: &str, text: &str) -> Result<Vec<serde_json::Value>, ReadError> {
    check_bounds(source_name, text)?;
    let syntax = |document: usize, format, message: String| ReadError::Syntax {
        source_name: source_name.to_string(),
        document,
        format,
        message,
    };
    let mut out = Vec::new();
    if text.trim_start().starts_with(['{', '[']) {
        for (i, value) in serde_json::Deserializer::from_str(text)
            .into_iter::<serde_json::Value>()
            .enumerate()
        {
            match value.map_err(|e| syntax(i + 1, "JSON", e.to_string()))? {
                serde_json::Value::Array(items) => out.extend(items),
                value => out.push(value),
            }
        }
        return Ok(out);
    }
    for (i, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value = serde_json::Value::deserialize(document)
            .map_err(|e| syntax(i + 1, "YAML", e.to_string()))?;
        if !value.is_null() {
            out.push(value);
        }
    }
    Ok(out)
}

/// Why a value is not the object its kind says.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StrictError {
    /// Fields the type does not have, each by its path.
    #[error("unknown field {}", .0.iter().map(|f| format!("{f:?}")).collect::<Vec<_>>().join(", unknown field "))]
    Unknown(Vec<String>),
    /// A field of the wrong type or value.
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

impl StrictError {
    /// The first field path the error names.
    pub fn path(&self) -> &str {
        match self {
            StrictError::Unknown(paths) => paths.first().map_or("", String::as_str),
            StrictError::Invalid { path, .. } => path,
        }
    }
}

/// `value` as a `T`, every field of it one `T` has, with the path of any
/// that is not (or is of the wrong type).
pub fn strict<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, StrictError> {
    let mut unknown = Vec::new();
    let parsed = serde_path_to_error::deserialize(serde_ignored::Deserializer::new(
        value,
        &mut |path: serde_ignored::Path<'_>| unknown.push(api_path(&path)),
    ));
    match parsed {
        Err(err) => Err(StrictError::Invalid {
            path: api_path_of(err.path()),
            message: err.inner().to_string(),
        }),
        Ok(_) if !unknown.is_empty() => Err(StrictError::Unknown(unknown)),
        Ok(value) => Ok(value),
    }
}

/// An ignored field's path as the API server writes it: `a.b[0].c`.
fn api_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", api_path(parent)),
        Path::Map { parent, key } => {
            let parent = api_path(parent);
            if parent.is_empty() {
                key.to_string()
            } else {
                format!("{parent}.{key}")
            }
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => api_path(parent),
    }
}

/// A failing field's path as the API server writes it.
fn api_path_of(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => {}
        }
    }
    if out.is_empty() {
        "(object)".into()
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::ResourceClaim;
    use serde_json::json;

    #[test]
    fn a_misplaced_and_a_misspelt_field_are_named_by_path() {
        let claim = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c"},
            "spec": {
                "constraints": [{"matchAttribute": "gpu.deckhouse.io/model"}],
                "devices": {"requests": [{"name": "r", "exactly": {
                    "deviceClassName": "gpu", "alocationMode": "All"}}]},
            },
        });
        let err = strict::<ResourceClaim>(claim).unwrap_err();
        assert_eq!(
            err,
            StrictError::Unknown(vec![
                "spec.constraints".into(),
                "spec.devices.requests[0].exactly.alocationMode".into()
            ])
        );
        assert_eq!(
            err.to_string(),
            "unknown field \"spec.constraints\", unknown field \"spec.devices.requests[0].exactly.alocationMode\""
        );
    }

    #[test]
    fn a_field_of_the_wrong_type_is_named_by_path() {
        let claim = json!({
            "metadata": {"name": "c"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {
                "deviceClassName": "gpu", "count": "two"}}]}},
        });
        let err = strict::<ResourceClaim>(claim).unwrap_err();
        assert_eq!(err.path(), "spec.devices.requests[0].exactly.count");
    }

    #[test]
    fn a_known_object_reads_whole() {
        let claim: ResourceClaim = strict(json!({
            "metadata": {"name": "c", "labels": {"a": "b"}},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {
                "deviceClassName": "gpu", "allocationMode": "ExactCount", "count": 2}}]}},
        }))
        .unwrap();
        assert_eq!(claim.metadata.name.as_deref(), Some("c"));
    }

    #[test]
    fn deep_flow_collections_are_refused_before_parsing() {
        let deep = format!("a: {}{}", "[".repeat(200_000), "]".repeat(200_000));
        let err = documents("deep.yaml", &deep).unwrap_err();
        assert_eq!(
            err,
            ReadError::TooDeep {
                source_name: "deep.yaml".into(),
                line: 1
            }
        );
        let deep_json = format!("{}1{}", "[".repeat(65), "]".repeat(65));
        assert!(matches!(
            documents("deep.json", &deep_json),
            Err(ReadError::TooDeep { .. })
        ));
        // Brackets in quoted strings and comments are text.
        let quoted = format!(
            "a: \"{}\"\nb: '{}'\n# {}\nc: [[1]]\n",
            "[".repeat(100),
            "{".repeat(100),
            "[".repeat(100)
        );
        assert_eq!(documents("q.yaml", &quoted).unwrap().len(), 1);
        let nested = format!("{}1{}", "[".repeat(64), "]".repeat(64));
        assert_eq!(documents("ok.json", &nested).unwrap().len(), 1);
    }

    #[test]
    fn oversize_input_is_refused_before_parsing() {
        let big = " ".repeat(MAX_INPUT_BYTES + 1);
        assert!(matches!(
            check_bounds("big.yaml", &big),
            Err(ReadError::TooLarge { .. })
        ));
    }
}
