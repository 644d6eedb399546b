//! A fresh, uniquely named table per test, created from the `StateTable` resource of
//! `infra/template.yaml`: the tests run against the table definition that is deployed.

use std::sync::Arc;

use anyhow::{Context, anyhow};
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{Credentials, Region};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType,
    PointInTimeRecoverySpecification, Projection, ProjectionType, ScalarAttributeType,
    SseSpecification, TimeToLiveSpecification,
};
use aws_smithy_runtime_api::client::http::SharedHttpClient;
use capacity_pilot::aws::dynamodb::DynamoStore;
use serde_json::Value;

use crate::moto::{Moto, workspace_root};

pub struct TestTable {
    pub name: String,
    /// A client built as production builds it, pointed at this test's server.
    pub client: Client,
    _moto: Arc<Moto>,
}

impl TestTable {
    /// Starts (or joins) moto and creates a table no other test uses.
    pub async fn fresh() -> anyhow::Result<TestTable> {
        let moto = Moto::shared()?;
        let client = client_for(moto.url()).await;
        let name = format!("state-{}", uuid::Uuid::new_v4().simple());
        create_state_table(&client, &name).await?;
        Ok(TestTable {
            name,
            client,
            _moto: moto,
        })
    }

    /// The store under test, on this table, through its production constructor.
    pub fn store(&self) -> DynamoStore {
        DynamoStore::new(self.client.clone(), self.name.clone())
    }

    /// The same store, its client sending through `http` (a recorder, say).
    pub fn store_with(&self, http: SharedHttpClient) -> DynamoStore {
        let config = self.client.config().to_builder().http_client(http).build();
        DynamoStore::new(Client::from_conf(config), self.name.clone())
    }

    /// The same store through `http`, its reads checked against the read rule by `reads`.
    pub fn store_checked(&self, http: SharedHttpClient, reads: crate::reads::Reads) -> DynamoStore {
        let config = self
            .client
            .config()
            .to_builder()
            .http_client(http)
            .interceptor(reads)
            .build();
        DynamoStore::new(Client::from_conf(config), self.name.clone())
    }
}

pub async fn client_for(endpoint_url: &str) -> Client {
    let config = capacity_pilot::aws::wiring::sdk_loader()
        .endpoint_url(endpoint_url)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "tests"))
        .load()
        .await;
    Client::new(&config)
}

/// `Resources.StateTable.Properties` of `infra/template.yaml`, as JSON.
pub fn state_table_properties() -> anyhow::Result<Value> {
    let path = workspace_root().join("infra/template.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    // A `Value` keeps CloudFormation's short-form tags (`!Ref`) elsewhere in the file.
    let doc: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let props = doc
        .get("Resources")
        .and_then(|r| r.get("StateTable"))
        .and_then(|t| t.get("Properties"))
        .ok_or_else(|| anyhow!("{} has no Resources.StateTable.Properties", path.display()))?;
    serde_yaml_ng::from_value(props.clone()).context("StateTable's Properties as JSON")
}

fn str_at<'a>(v: &'a Value, field: &str) -> anyhow::Result<&'a str> {
    v.get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("StateTable: {field} is missing or not a string in {v}"))
}

fn list_at<'a>(v: &'a Value, field: &str) -> anyhow::Result<&'a [Value]> {
    v.get(field)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .ok_or_else(|| anyhow!("StateTable: {field} is missing or not a list in {v}"))
}

fn key_schema(v: &Value) -> anyhow::Result<Vec<KeySchemaElement>> {
    list_at(v, "KeySchema")?
        .iter()
        .map(|k| {
            Ok(KeySchemaElement::builder()
                .attribute_name(str_at(k, "AttributeName")?)
                .key_type(KeyType::from(str_at(k, "KeyType")?))
                .build()?)
        })
        .collect()
}

/// CreateTable (plus TTL and PITR, which CloudFormation sets on the table) from the
/// template. The KMS key and deletion protection are deployment concerns moto ignores.
pub async fn create_state_table(client: &Client, name: &str) -> anyhow::Result<()> {
    let p = state_table_properties()?;
    let mut req = client
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::from(str_at(&p, "BillingMode")?))
        .set_key_schema(Some(key_schema(&p)?));
    for a in list_at(&p, "AttributeDefinitions")? {
        req = req.attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(str_at(a, "AttributeName")?)
                .attribute_type(ScalarAttributeType::from(str_at(a, "AttributeType")?))
                .build()?,
        );
    }
    for g in p
        .get("GlobalSecondaryIndexes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let proj = g
            .get("Projection")
            .ok_or_else(|| anyhow!("StateTable: an index without Projection"))?;
        let non_key = proj
            .get("NonKeyAttributes")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            });
        req = req.global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(str_at(g, "IndexName")?)
                .set_key_schema(Some(key_schema(g)?))
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::from(str_at(proj, "ProjectionType")?))
                        .set_non_key_attributes(non_key)
                        .build(),
                )
                .build()?,
        );
    }
    if let Some(sse) = p.get("SSESpecification") {
        let enabled = sse.get("SSEEnabled").and_then(Value::as_bool) == Some(true);
        req = req.sse_specification(SseSpecification::builder().enabled(enabled).build());
    }
    req.send()
        .await
        .with_context(|| format!("CreateTable {name}"))?;

    if let Some(ttl) = p.get("TimeToLiveSpecification") {
        client
            .update_time_to_live()
            .table_name(name)
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .attribute_name(str_at(ttl, "AttributeName")?)
                    .enabled(ttl.get("Enabled").and_then(Value::as_bool) == Some(true))
                    .build()?,
            )
            .send()
            .await
            .with_context(|| format!("UpdateTimeToLive {name}"))?;
    }
    if let Some(pitr) = p.get("PointInTimeRecoverySpecification") {
        let enabled = pitr
            .get("PointInTimeRecoveryEnabled")
            .and_then(Value::as_bool)
            == Some(true);
        client
            .update_continuous_backups()
            .table_name(name)
            .point_in_time_recovery_specification(
                PointInTimeRecoverySpecification::builder()
                    .point_in_time_recovery_enabled(enabled)
                    .build()?,
            )
            .send()
            .await
            .with_context(|| format!("UpdateContinuousBackups {name}"))?;
    }
    Ok(())
}
