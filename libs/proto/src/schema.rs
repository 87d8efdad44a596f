//! JSON Schemas (draft 2020-12) of the messages' canonical JSON, derived from
//! the compiled `.proto` files.
//!
//! A schema describes exactly what `serde_json::to_value(&message)` produces
//! with the pbjson code this crate generates:
//!
//! - properties are the proto field names (snake_case), and no others;
//! - no property is required: proto3 leaves out fields that hold their
//!   default value (an `optional` field or a message field is present when set);
//! - 32-bit integers are JSON integers within the type's range; 64-bit
//!   integers are decimal strings, as the proto3 JSON mapping writes them;
//! - `float` and `double` are numbers (serde_json writes a non-finite one as
//!   `null`, which the schema does not accept);
//! - `bytes` are standard base64 with padding;
//! - enums are their value names (pbjson refuses to write an unknown number);
//! - repeated fields are arrays, maps are objects keyed by the key as a string;
//! - message fields refer to `#/$defs/<full name>`, where every message the
//!   schema reaches is defined;
//! - the members of a oneof are ordinary properties: at most one is present,
//!   which a `$comment` notes but the schema does not enforce.

use std::collections::HashMap;
use std::sync::OnceLock;

use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, EnumDescriptorProto, FieldDescriptorProto, FileDescriptorSet};
use serde_json::{Map, Value, json};

use crate::v1::EVENT_TYPES;

/// The `FileDescriptorSet` of `proto/`, as the build script compiled it
/// (with source info, so comments are available).
pub const DESCRIPTOR: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/switchyard_descriptor.bin"));

const DRAFT_2020_12: &str = "https://json-schema.org/draft/2020-12/schema";

/// Where the schema of the `data` of a CloudEvent of type `<type>` is
/// published: `<EVENT_SCHEMA_BASE><type>.json`.
pub const EVENT_SCHEMA_BASE: &str = "https://switchyard.io/schemas/events/";

/// The JSON Schema of the canonical JSON of the message `message_full_name`
/// (e.g. `switchyard.v1.HandoverCompleted`); `None` for a name the descriptor
/// does not define.
///
/// The schema's `title` is the message's name and its `description` the
/// message's leading comment; each property carries its field's leading
/// comment the same way.
pub fn json_schema(message_full_name: &str) -> Option<Value> {
    let index = Index::new(descriptor_set());
    let mut referenced = Vec::new();
    let mut schema = index.message_schema(message_full_name, &mut referenced)?;

    let mut defs = Map::new();
    while let Some(name) = referenced.pop() {
        if !defs.contains_key(&name) {
            let def = index.message_schema(&name, &mut referenced)?;
            defs.insert(name, Value::Object(def));
        }
    }

    schema.insert("$schema".into(), DRAFT_2020_12.into());
    if !defs.is_empty() {
        schema.insert("$defs".into(), Value::Object(defs));
    }
    Some(Value::Object(schema))
}

/// The JSON Schema of the `data` of a CloudEvent of type `cloudevent_type`
/// (e.g. `io.switchyard.handover.completed`): [`json_schema`] of the event's
/// message, with `$id` set to where it is published. `None` for a type no
/// event kind has.
pub fn event_schema(cloudevent_type: &str) -> Option<Value> {
    let (_, _, message) = EVENT_TYPES
        .iter()
        .find(|(_, ty, _)| *ty == cloudevent_type)?;
    let mut schema = json_schema(message)?;
    schema.as_object_mut()?.insert(
        "$id".into(),
        format!("{EVENT_SCHEMA_BASE}{cloudevent_type}.json").into(),
    );
    Some(schema)
}

fn descriptor_set() -> &'static FileDescriptorSet {
    static SET: OnceLock<FileDescriptorSet> = OnceLock::new();
    SET.get_or_init(|| {
        FileDescriptorSet::decode(DESCRIPTOR)
            .expect("the build script writes a valid FileDescriptorSet")
    })
}

// Field numbers within descriptor.proto, which make up source-info paths.
const FILE_MESSAGE_TYPE: i32 = 4;
const FILE_ENUM_TYPE: i32 = 5;
const MESSAGE_FIELD: i32 = 2;
const MESSAGE_NESTED_TYPE: i32 = 3;
const MESSAGE_ENUM_TYPE: i32 = 4;

/// A definition and where its comments are: the file's position in the set
/// and the definition's source-info path within the file.
struct Located<'a, T> {
    proto: &'a T,
    file: usize,
    path: Vec<i32>,
}

/// The messages and enums of a descriptor set by full name (no leading dot),
/// and the leading comments of every definition that has one.
struct Index<'a> {
    messages: HashMap<String, Located<'a, DescriptorProto>>,
    enums: HashMap<String, Located<'a, EnumDescriptorProto>>,
    comments: HashMap<(usize, Vec<i32>), &'a str>,
}

impl<'a> Index<'a> {
    fn new(set: &'a FileDescriptorSet) -> Self {
        let mut index = Index {
            messages: HashMap::new(),
            enums: HashMap::new(),
            comments: HashMap::new(),
        };
        for (file, proto) in set.file.iter().enumerate() {
            let package = proto.package();
            index.add_messages(file, package, &[FILE_MESSAGE_TYPE], &proto.message_type);
            index.add_enums(file, package, &[FILE_ENUM_TYPE], &proto.enum_type);
            let locations = proto
                .source_code_info
                .iter()
                .flat_map(|info| &info.location);
            for location in locations {
                if let Some(comment) = location.leading_comments.as_deref() {
                    index
                        .comments
                        .insert((file, location.path.clone()), comment);
                }
            }
        }
        index
    }

    /// Adds `messages`, declared in `scope` at the source-info path
    /// `prefix` + index, and the messages and enums nested in them.
    fn add_messages(
        &mut self,
        file: usize,
        scope: &str,
        prefix: &[i32],
        messages: &'a [DescriptorProto],
    ) {
        for (i, proto) in messages.iter().enumerate() {
            let name = qualify(scope, proto.name());
            let path = [prefix, &[i as i32]].concat();
            self.add_messages(
                file,
                &name,
                &[&path[..], &[MESSAGE_NESTED_TYPE]].concat(),
                &proto.nested_type,
            );
            self.add_enums(
                file,
                &name,
                &[&path[..], &[MESSAGE_ENUM_TYPE]].concat(),
                &proto.enum_type,
            );
            self.messages.insert(name, Located { proto, file, path });
        }
    }

    fn add_enums(
        &mut self,
        file: usize,
        scope: &str,
        prefix: &[i32],
        enums: &'a [EnumDescriptorProto],
    ) {
        for (i, proto) in enums.iter().enumerate() {
            let path = [prefix, &[i as i32]].concat();
            self.enums
                .insert(qualify(scope, proto.name()), Located { proto, file, path });
        }
    }

    /// The leading comment at `path` of `file`, with the comment's line
    /// breaks undone: lines of a paragraph joined by spaces, paragraphs by a
    /// blank line.
    fn description(&self, file: usize, path: Vec<i32>) -> Option<Value> {
        let comment = self.comments.get(&(file, path))?;
        let paragraphs: Vec<String> = comment
            .split("\n\n")
            .map(|paragraph| paragraph.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|paragraph| !paragraph.is_empty())
            .collect();
        (!paragraphs.is_empty()).then(|| paragraphs.join("\n\n").into())
    }

    /// The schema of one message, pushing the full names of the messages its
    /// fields refer to onto `referenced`.
    fn message_schema(
        &self,
        full_name: &str,
        referenced: &mut Vec<String>,
    ) -> Option<Map<String, Value>> {
        let message = self.messages.get(full_name)?;
        let mut properties = Map::new();
        for (i, field) in message.proto.field.iter().enumerate() {
            let mut property = self.field_schema(field, referenced)?;
            let path = [&message.path[..], &[MESSAGE_FIELD, i as i32]].concat();
            if let Some(description) = self.description(message.file, path) {
                property["description"] = description;
            }
            properties.insert(field.name().into(), property);
        }

        let mut schema = Map::new();
        schema.insert("title".into(), message.proto.name().into());
        if let Some(description) = self.description(message.file, message.path.clone()) {
            schema.insert("description".into(), description);
        }
        schema.insert("type".into(), "object".into());
        schema.insert("properties".into(), Value::Object(properties));
        schema.insert("additionalProperties".into(), false.into());
        let notes = oneof_notes(message.proto);
        if !notes.is_empty() {
            schema.insert("$comment".into(), notes.join(" ").into());
        }
        Some(schema)
    }

    fn field_schema(
        &self,
        field: &FieldDescriptorProto,
        referenced: &mut Vec<String>,
    ) -> Option<Value> {
        if field.label() != Label::Repeated {
            return self.value_schema(field, referenced);
        }
        let Some(entry) = self.map_entry(field) else {
            let items = self.value_schema(field, referenced)?;
            return Some(json!({ "type": "array", "items": items }));
        };
        let key = entry.field.iter().find(|f| f.number() == 1)?;
        let value = entry.field.iter().find(|f| f.number() == 2)?;
        let mut schema = json!({
            "type": "object",
            "additionalProperties": self.value_schema(value, referenced)?,
        });
        // serde_json writes integer and bool keys as their decimal or
        // `true`/`false` text.
        let key_names = match key.r#type() {
            Type::Bool => Some(json!({ "enum": ["true", "false"] })),
            ty if is_unsigned(ty) => Some(json!({ "pattern": "^[0-9]+$" })),
            ty if is_signed(ty) => Some(json!({ "pattern": "^-?[0-9]+$" })),
            _ => None,
        };
        if let Some(key_names) = key_names {
            schema["propertyNames"] = key_names;
        }
        Some(schema)
    }

    /// The entry message of a map field; `None` for any other field.
    fn map_entry(&self, field: &FieldDescriptorProto) -> Option<&'a DescriptorProto> {
        if field.r#type() != Type::Message {
            return None;
        }
        let entry = self
            .messages
            .get(field.type_name().trim_start_matches('.'))?
            .proto;
        entry.options.as_ref()?.map_entry().then_some(entry)
    }

    /// The schema of one value of `field`, ignoring whether it is repeated.
    fn value_schema(
        &self,
        field: &FieldDescriptorProto,
        referenced: &mut Vec<String>,
    ) -> Option<Value> {
        let schema = match field.r#type() {
            Type::Message | Type::Group => {
                let name = field.type_name().trim_start_matches('.');
                self.messages.get(name)?;
                referenced.push(name.to_owned());
                json!({ "$ref": format!("#/$defs/{name}") })
            }
            Type::Enum => {
                let name = field.type_name().trim_start_matches('.');
                let values: Vec<&str> = self
                    .enums
                    .get(name)?
                    .proto
                    .value
                    .iter()
                    .map(|v| v.name())
                    .collect();
                json!({ "type": "string", "enum": values })
            }
            Type::String => json!({ "type": "string" }),
            Type::Bool => json!({ "type": "boolean" }),
            Type::Double | Type::Float => json!({ "type": "number" }),
            Type::Bytes => json!({
                "type": "string",
                "contentEncoding": "base64",
                "pattern": "^[A-Za-z0-9+/]*={0,2}$",
            }),
            Type::Int32 | Type::Sint32 | Type::Sfixed32 => {
                json!({ "type": "integer", "minimum": i32::MIN, "maximum": i32::MAX })
            }
            Type::Uint32 | Type::Fixed32 => {
                json!({ "type": "integer", "minimum": 0, "maximum": u32::MAX })
            }
            Type::Int64 | Type::Sint64 | Type::Sfixed64 => {
                json!({ "type": "string", "pattern": "^-?[0-9]+$" })
            }
            Type::Uint64 | Type::Fixed64 => json!({ "type": "string", "pattern": "^[0-9]+$" }),
        };
        Some(schema)
    }
}

/// One sentence per real oneof of `message` (not the synthetic one of a
/// proto3 `optional` field) naming its members.
fn oneof_notes(message: &DescriptorProto) -> Vec<String> {
    let mut notes = Vec::new();
    for (i, oneof) in message.oneof_decl.iter().enumerate() {
        let members: Vec<String> = message
            .field
            .iter()
            .filter(|f| f.oneof_index == Some(i as i32) && !f.proto3_optional())
            .map(|f| format!("`{}`", f.name()))
            .collect();
        if !members.is_empty() {
            notes.push(format!(
                "At most one of {} is present (oneof `{}`).",
                members.join(", "),
                oneof.name()
            ));
        }
    }
    notes
}

fn qualify(scope: &str, name: &str) -> String {
    if scope.is_empty() {
        name.to_owned()
    } else {
        format!("{scope}.{name}")
    }
}

fn is_signed(ty: Type) -> bool {
    matches!(
        ty,
        Type::Int32 | Type::Sint32 | Type::Sfixed32 | Type::Int64 | Type::Sint64 | Type::Sfixed64
    )
}

fn is_unsigned(ty: Type) -> bool {
    matches!(
        ty,
        Type::Uint32 | Type::Fixed32 | Type::Uint64 | Type::Fixed64
    )
}
