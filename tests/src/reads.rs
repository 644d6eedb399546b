//! The read rule (issue 20), checked from the calls a store's DynamoDB client makes: within
//! one invocation, no item of the table is read twice without a write to it in between.
//! Index rows are scheduling, not reads of the item; a write counts whether or not its
//! condition held, because after a refused conditional write reading again is required.
//!
//! An SDK interceptor on the store's client sees each operation's typed input and output:
//! `GetItem` reads its key, a table `Query` every item it returned, and `PutItem`,
//! `UpdateItem`, `DeleteItem` and each part of `TransactWriteItems` write theirs. Nothing in
//! production code knows about it; it is added to the client's configuration as any other
//! interceptor would be.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::config::interceptors::{
    BeforeSerializationInterceptorContextRef, FinalizerInterceptorContextRef,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::operation::delete_item::DeleteItemInput;
use aws_sdk_dynamodb::operation::get_item::GetItemInput;
use aws_sdk_dynamodb::operation::put_item::PutItemInput;
use aws_sdk_dynamodb::operation::query::{QueryInput, QueryOutput};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsInput;
use aws_sdk_dynamodb::operation::update_item::UpdateItemInput;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_types::config_bag::{Storable, StoreReplace};

/// An item's key: `(pk, sk)`.
pub type Key = (String, String);

/// What one store's client read and wrote since [`Reads::begin`], and every re-read without
/// a write in between.
#[derive(Clone, Debug, Default)]
pub struct Reads(Arc<Mutex<State>>);

#[derive(Debug, Default)]
struct State {
    /// Items read since their last write in this invocation.
    fresh: BTreeSet<Key>,
    /// `(operation, key)` of each read that found its item already read and not written.
    again: Vec<(String, Key)>,
}

impl Reads {
    /// A new invocation starts: nothing it reads has been read yet.
    pub fn begin(&self) {
        let mut s = self.0.lock().unwrap();
        s.fresh.clear();
        s.again.clear();
    }

    /// The reads of this invocation that read an item again without writing it in between.
    pub fn again(&self) -> Vec<(String, Key)> {
        self.0.lock().unwrap().again.clone()
    }

    fn read(&self, op: &str, keys: impl IntoIterator<Item = Key>) {
        let mut s = self.0.lock().unwrap();
        for k in keys {
            if !s.fresh.insert(k.clone()) {
                s.again.push((op.to_string(), k));
            }
        }
    }

    fn wrote(&self, keys: impl IntoIterator<Item = Key>) {
        let mut s = self.0.lock().unwrap();
        for k in keys {
            s.fresh.remove(&k);
        }
    }
}

fn key_of(item: &HashMap<String, AttributeValue>) -> Option<Key> {
    match (item.get("pk"), item.get("sk")) {
        (Some(AttributeValue::S(pk)), Some(AttributeValue::S(sk))) => {
            Some((pk.clone(), sk.clone()))
        }
        _ => None,
    }
}

/// The operation under way, kept between the interceptor's hooks.
#[derive(Debug, Clone)]
enum Pending {
    Get(Key),
    /// A Query of the table (not of an index): its items are read once it answers.
    Query,
}

impl Storable for Pending {
    type Storer = StoreReplace<Self>;
}

impl Intercept for Reads {
    fn name(&self) -> &'static str {
        "ReadRule"
    }

    fn read_before_execution(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let input = context.input();
        if let Some(i) = input.downcast_ref::<GetItemInput>() {
            if let Some(k) = i.key().and_then(key_of) {
                cfg.interceptor_state().store_put(Pending::Get(k));
            }
        } else if let Some(i) = input.downcast_ref::<QueryInput>() {
            if i.index_name().is_none() {
                cfg.interceptor_state().store_put(Pending::Query);
            }
        } else if let Some(i) = input.downcast_ref::<PutItemInput>() {
            self.wrote(i.item().and_then(key_of));
        } else if let Some(i) = input.downcast_ref::<UpdateItemInput>() {
            self.wrote(i.key().and_then(key_of));
        } else if let Some(i) = input.downcast_ref::<DeleteItemInput>() {
            self.wrote(i.key().and_then(key_of));
        } else if let Some(i) = input.downcast_ref::<TransactWriteItemsInput>() {
            self.wrote(i.transact_items().iter().filter_map(|t| {
                t.put()
                    .map(|p| p.item())
                    .or_else(|| t.update().map(|u| u.key()))
                    .or_else(|| t.delete().map(|d| d.key()))
                    .or_else(|| t.condition_check().map(|c| c.key()))
                    .and_then(key_of)
            }));
        }
        Ok(())
    }

    fn read_after_execution(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(Ok(output)) = context.output_or_error() else {
            return Ok(());
        };
        match cfg.load::<Pending>() {
            Some(Pending::Get(k)) => self.read("GetItem", [k.clone()]),
            Some(Pending::Query) => {
                if let Some(o) = output.downcast_ref::<QueryOutput>() {
                    self.read("Query", o.items().iter().filter_map(key_of));
                }
            }
            None => {}
        }
        Ok(())
    }
}
