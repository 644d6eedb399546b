//! Tags on SageMaker resources: given on a create, added with `AddTags`, read back with
//! `ListTags` (paginated), removed with `DeleteTags`, and gone with a deleted resource. The
//! unmodified SDK client must parse every answer, paginator included.

use aws_sdk_sagemaker::error::ProvideErrorMetadata;
use aws_sdk_sagemaker::types::{
    ProductionVariant, ProductionVariantInstanceType, SageMakerResourceName, Tag,
};

use crate::helpers::*;
use crate::sagemaker_plans::{buy_plan, plan_offerings};

fn tag(k: &str, v: &str) -> Tag {
    Tag::builder().key(k).value(v).build()
}

async fn tags_of(env: &Env, arn: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut pages = env
        .sm
        .list_tags()
        .resource_arn(arn)
        .into_paginator()
        .items()
        .send();
    while let Some(t) = pages.next().await {
        let t = t.expect("ListTags parses");
        out.push((
            t.key().unwrap_or_default().to_string(),
            t.value().unwrap_or_default().to_string(),
        ));
    }
    out
}

#[tokio::test]
async fn tags_given_at_create_are_listed_added_and_deleted() {
    let env = env().await;
    let created = env
        .sm
        .create_cluster()
        .cluster_name("tagged")
        .tags(tag("capacity-pilot:managed", "true"))
        .tags(tag("team", "f"))
        .send()
        .await
        .unwrap();
    let arn = created.cluster_arn().unwrap().to_string();
    assert_eq!(
        tags_of(&env, &arn).await,
        [
            ("capacity-pilot:managed".to_string(), "true".to_string()),
            ("team".to_string(), "f".to_string())
        ]
    );

    // AddTags overwrites a key that exists and appends a new one; it answers what it added
    let added = env
        .sm
        .add_tags()
        .resource_arn(&arn)
        .tags(tag("team", "g"))
        .tags(tag("cost-center", "cc-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(added.tags().len(), 2);
    assert_eq!(added.tags()[0].key(), Some("team"));
    assert_eq!(
        tags_of(&env, &arn).await,
        [
            ("capacity-pilot:managed".to_string(), "true".to_string()),
            ("team".to_string(), "g".to_string()),
            ("cost-center".to_string(), "cc-1".to_string())
        ]
    );

    env.sm
        .delete_tags()
        .resource_arn(&arn)
        .tag_keys("team")
        .send()
        .await
        .unwrap();
    let keys: Vec<String> = tags_of(&env, &arn).await.into_iter().map(|t| t.0).collect();
    assert_eq!(keys, ["capacity-pilot:managed", "cost-center"]);

    // a resource created without tags has none
    let bare = env
        .sm
        .create_cluster()
        .cluster_name("bare")
        .send()
        .await
        .unwrap();
    assert!(tags_of(&env, bare.cluster_arn().unwrap()).await.is_empty());
}

#[tokio::test]
async fn list_tags_pages_through_many_tags() {
    let env = env().await;
    let mut create = env.sm.create_cluster().cluster_name("many");
    for i in 0..50 {
        create = create.tags(tag(&format!("k{i:02}"), &i.to_string()));
    }
    let arn = create
        .send()
        .await
        .unwrap()
        .cluster_arn()
        .unwrap()
        .to_string();
    let first = env
        .sm
        .list_tags()
        .resource_arn(&arn)
        .max_results(50)
        .send()
        .await
        .unwrap();
    assert_eq!(first.tags().len(), 50);
    assert!(first.next_token().is_none());
    assert_eq!(tags_of(&env, &arn).await.len(), 50);
    // a 51st tag is over SageMaker's limit
    let err = env
        .sm
        .add_tags()
        .resource_arn(&arn)
        .tags(tag("one-more", "x"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ResourceLimitExceeded"));
}

#[tokio::test]
async fn tags_are_checked_and_unknown_resources_refused() {
    let env = env().await;
    let err = env
        .sm
        .create_cluster()
        .cluster_name("reserved")
        .tags(tag("aws:owner", "me"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));
    // the create failed as a whole: no cluster
    let err = env
        .sm
        .describe_cluster()
        .cluster_name("reserved")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ResourceNotFound"));

    let err = env
        .sm
        .list_tags()
        .resource_arn("arn:aws:sagemaker:us-east-1:123456789012:cluster/nope")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));
}

#[tokio::test]
async fn plans_and_endpoints_carry_their_tags_until_deleted() {
    let env = env().await;
    let offer = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        1,
        24,
        SageMakerResourceName::Endpoint,
    )
    .await
    .remove(0);
    let plan = buy_plan(&env, "ep-plan", &offer).await;
    assert!(tags_of(&env, &plan).await.is_empty());
    env.sm
        .add_tags()
        .resource_arn(&plan)
        .tags(tag("capacity-pilot:request-id", "r-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        tags_of(&env, &plan).await,
        [("capacity-pilot:request-id".to_string(), "r-1".to_string())]
    );

    create_model(&env, "m").await;
    let config = env
        .sm
        .create_endpoint_config()
        .endpoint_config_name("cfg")
        .production_variants(
            ProductionVariant::builder()
                .variant_name("primary")
                .model_name("m")
                .initial_instance_count(1)
                .instance_type(ProductionVariantInstanceType::from("ml.g5.xlarge"))
                .build(),
        )
        .tags(tag("capacity-pilot:managed", "true"))
        .send()
        .await
        .unwrap();
    let config_arn = config.endpoint_config_arn().unwrap().to_string();
    assert_eq!(tags_of(&env, &config_arn).await.len(), 1);
    env.sm
        .delete_endpoint_config()
        .endpoint_config_name("cfg")
        .send()
        .await
        .unwrap();
    let err = env
        .sm
        .list_tags()
        .resource_arn(&config_arn)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));
}

#[tokio::test]
async fn tag_characters_follow_sagemakers_narrower_pattern() {
    // aws-reference §11.2: TagKey/TagValue pattern ([\p{L}\p{Z}\p{N}_.:/=+\-@]*), narrower
    // than EC2's: '&', '#', '!' or a combining mark are refused, any script's letters pass.
    let env = env().await;
    for (k, v) in [
        ("owner", "ml&search"),
        ("cost#center", "cc"),
        ("team", "re\u{301}search"),
    ] {
        let err = env
            .sm
            .create_cluster()
            .cluster_name("bad-tags")
            .tags(tag(k, v))
            .send()
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some("ValidationException"), "{k}={v}");
        assert!(
            err.message()
                .unwrap_or_default()
                .contains("Member must satisfy regular expression pattern"),
            "{err:?}"
        );
    }
    env.sm
        .create_cluster()
        .cluster_name("good-tags")
        .tags(tag("équipe", "recherche 東京 ٣ _.:/=+-@"))
        .send()
        .await
        .expect("letters, numbers, spaces and _.:/=+-@ of any script are allowed");
}
