//! Builds update and condition expressions with generated placeholders, so no attribute name
//! (several of ours, like `status`, are reserved words) or value is ever spliced into text.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

#[derive(Debug, Default)]
pub(super) struct Expr {
    sets: Vec<String>,
    removes: Vec<String>,
    adds: Vec<String>,
    conditions: Vec<String>,
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl Expr {
    pub(super) fn new() -> Expr {
        Expr::default()
    }

    /// The placeholder of an attribute name.
    pub(super) fn name(&mut self, attr: &str) -> String {
        let placeholder = format!("#{attr}");
        self.names.insert(placeholder.clone(), attr.to_string());
        placeholder
    }

    /// The placeholder of a value.
    pub(super) fn value(&mut self, v: AttributeValue) -> String {
        let placeholder = format!(":v{}", self.values.len());
        self.values.insert(placeholder.clone(), v);
        placeholder
    }

    /// The placeholder of a name that is data, not one of ours (a map key): numbered, since
    /// the name may hold characters a placeholder may not.
    pub(super) fn data_name(&mut self, name: &str) -> String {
        let placeholder = format!("#k{}", self.names.len());
        self.names.insert(placeholder.clone(), name.to_string());
        placeholder
    }

    /// `SET path = value`, both already placeholders (a map entry: `#map.#key`).
    pub(super) fn set_path(&mut self, path: String, value: String) -> &mut Expr {
        self.sets.push(format!("{path} = {value}"));
        self
    }

    pub(super) fn set(&mut self, attr: &str, v: AttributeValue) -> &mut Expr {
        let (n, p) = (self.name(attr), self.value(v));
        self.sets.push(format!("{n} = {p}"));
        self
    }

    pub(super) fn remove(&mut self, attr: &str) -> &mut Expr {
        let n = self.name(attr);
        self.removes.push(n);
        self
    }

    /// `ADD attr v`: numeric addition, creating the attribute at zero when absent.
    pub(super) fn add(&mut self, attr: &str, v: AttributeValue) -> &mut Expr {
        let (n, p) = (self.name(attr), self.value(v));
        self.adds.push(format!("{n} {p}"));
        self
    }

    /// One clause of the condition (clauses are AND-ed). Build it with `name` and `value`.
    pub(super) fn condition(&mut self, clause: String) -> &mut Expr {
        self.conditions.push(clause);
        self
    }

    pub(super) fn update_expression(&self) -> Option<String> {
        let mut parts = Vec::new();
        if !self.sets.is_empty() {
            parts.push(format!("SET {}", self.sets.join(", ")));
        }
        if !self.removes.is_empty() {
            parts.push(format!("REMOVE {}", self.removes.join(", ")));
        }
        if !self.adds.is_empty() {
            parts.push(format!("ADD {}", self.adds.join(", ")));
        }
        (!parts.is_empty()).then(|| parts.join(" "))
    }

    pub(super) fn condition_expression(&self) -> Option<String> {
        (!self.conditions.is_empty()).then(|| {
            self.conditions
                .iter()
                .map(|c| format!("({c})"))
                .collect::<Vec<_>>()
                .join(" AND ")
        })
    }

    /// DynamoDB refuses empty maps, hence `None`.
    pub(super) fn names(&self) -> Option<HashMap<String, String>> {
        (!self.names.is_empty()).then(|| self.names.clone())
    }

    pub(super) fn values(&self) -> Option<HashMap<String, AttributeValue>> {
        (!self.values.is_empty()).then(|| self.values.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_reads_as_set_remove_add_with_placeholders_only() {
        let mut e = Expr::new();
        e.set("status", AttributeValue::S("Reserved".into()))
            .remove("lease_token")
            .add("spent_micros", AttributeValue::N("5".into()));
        let cond = format!(
            "{} = {}",
            e.name("version"),
            e.value(AttributeValue::N("3".into()))
        );
        e.condition(cond);
        assert_eq!(
            e.update_expression().unwrap(),
            "SET #status = :v0 REMOVE #lease_token ADD #spent_micros :v1"
        );
        assert_eq!(e.condition_expression().unwrap(), "(#version = :v2)");
        assert_eq!(e.names().unwrap().len(), 4);
    }
}
