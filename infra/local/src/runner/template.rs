//! What the template says about each function, resolved to local values: its binary (from
//! `CodeUri`), its `Environment` (Globals merged with its own, `Ref`s resolved), memory and
//! timeout. The deployed configuration is the one that runs locally.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail};
use serde_json::Value;

/// One function as the template declares it.
#[derive(Debug, Clone)]
pub struct FunctionSpec {
    /// The crate and binary name, from `CodeUri`.
    pub name: String,
    pub logical_id: String,
    /// The template's `Environment.Variables`, resolved.
    pub env: BTreeMap<String, String>,
    pub memory_mb: u64,
    pub timeout_s: u64,
}

/// Local values for the template's `Ref`s: resources by logical id, parameters by name.
#[derive(Debug, Clone, Default)]
pub struct Locals {
    pub resources: BTreeMap<String, String>,
    pub parameters: BTreeMap<String, String>,
}

/// Every `AWS::Serverless::Function` of the template, in the template's order.
pub fn functions(template: &Value, locals: &Locals) -> anyhow::Result<Vec<FunctionSpec>> {
    let globals = &template["Globals"]["Function"];
    let resources = template["Resources"]
        .as_object()
        .ok_or_else(|| anyhow!("the template has no Resources"))?;
    let mut out = Vec::new();
    for (logical_id, r) in resources {
        if r["Type"] != "AWS::Serverless::Function" {
            continue;
        }
        let p = &r["Properties"];
        let name = p["CodeUri"]
            .as_str()
            .and_then(|u| u.trim_end_matches('/').rsplit('/').next())
            .ok_or_else(|| anyhow!("{logical_id} has no CodeUri naming its binary"))?
            .to_string();
        let mut env = BTreeMap::new();
        for vars in [
            &globals["Environment"]["Variables"],
            &p["Environment"]["Variables"],
        ] {
            for (k, v) in vars.as_object().into_iter().flatten() {
                let value = resolve(template, locals, v)
                    .map_err(|e| anyhow!("{logical_id}: environment variable {k}: {e}"))?;
                env.insert(k.clone(), value);
            }
        }
        let number = |k: &str, default: u64| {
            p.get(k)
                .or_else(|| globals.get(k))
                .and_then(Value::as_u64)
                .unwrap_or(default)
        };
        out.push(FunctionSpec {
            name,
            logical_id: logical_id.clone(),
            env,
            memory_mb: number("MemorySize", 128),
            timeout_s: number("Timeout", 3),
        });
    }
    Ok(out)
}

/// A literal, or `{Ref: X}` with X a resource the runner provides or a parameter (the
/// runner's value, else its `Default`).
fn resolve(template: &Value, locals: &Locals, v: &Value) -> anyhow::Result<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Object(o) if o.len() == 1 && o.contains_key("Ref") => {
            let name = o["Ref"].as_str().unwrap_or_default();
            if let Some(r) = locals.resources.get(name) {
                return Ok(r.clone());
            }
            if let Some(p) = locals.parameters.get(name) {
                return Ok(p.clone());
            }
            match template["Parameters"][name].get("Default") {
                Some(d) => resolve(template, locals, d),
                None if template["Parameters"].get(name).is_some() => {
                    bail!("parameter {name} has no Default: give it in the scenario's `parameters`")
                }
                None => {
                    bail!("Ref {name} is neither a parameter nor a resource the runner provides")
                }
            }
        }
        other => bail!("{other} is not a value the local runner resolves (a literal or a Ref)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn globals_and_refs_resolve_to_local_values() {
        let t = json!({
            "Parameters": {"A": {"Type": "String", "Default": "x"}, "B": {"Type": "String"}},
            "Globals": {"Function": {"MemorySize": 256, "Timeout": 60,
                "Environment": {"Variables": {"TABLE": {"Ref": "T"}, "A": {"Ref": "A"}, "B": {"Ref": "B"}}}}},
            "Resources": {"F": {"Type": "AWS::Serverless::Function",
                "Properties": {"CodeUri": "../target/lambda/f-fn/", "Timeout": 120,
                    "Environment": {"Variables": {"N": 5}}}}}
        });
        let mut locals = Locals::default();
        locals.resources.insert("T".into(), "table-1".into());
        assert!(functions(&t, &locals).is_err(), "B has no default");
        locals.parameters.insert("B".into(), "y".into());
        let f = &functions(&t, &locals).unwrap()[0];
        assert_eq!(f.name, "f-fn");
        assert_eq!((f.memory_mb, f.timeout_s), (256, 120));
        assert_eq!(f.env["TABLE"], "table-1");
        assert_eq!(f.env["A"], "x");
        assert_eq!(f.env["B"], "y");
        assert_eq!(f.env["N"], "5");
    }
}
