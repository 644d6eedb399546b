//! STS `GetCallerIdentity` (awsQuery, XML answers in the
//! `https://sts.amazonaws.com/doc/2011-06-15/` namespace): who the request's access key id
//! (the `Credential=AKID/...` of its SigV4 signature) belongs to. Identities are registered by
//! [`World::put_identity`] or `POST /_local/identities`; any other key is an IAM user named
//! after it in the emulator's account.

use crate::cloudformation::invalid_action;
use crate::error::ApiError;
use crate::query::Query;
use crate::util::hex_id;
use crate::world::World;
use crate::xml::El;

/// The namespace of STS's answers.
pub const XMLNS: &str = "https://sts.amazonaws.com/doc/2011-06-15/";

/// Who is calling, as GetCallerIdentity answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallerIdentity {
    pub arn: String,
    pub user_id: String,
    pub account: String,
}

impl World {
    /// Control: requests signed with `access_key_id` come from `arn` (an IAM user or role, an
    /// assumed-role session, the root user).
    pub fn put_identity(&mut self, access_key_id: &str, arn: &str) -> Result<(), ApiError> {
        let parts: Vec<&str> = arn.splitn(6, ':').collect();
        if access_key_id.is_empty()
            || parts.len() != 6
            || parts[0] != "arn"
            || !matches!(parts[2], "iam" | "sts")
        {
            return Err(ApiError::new(
                400,
                "BadRequest",
                format!(
                    "an identity needs an access key id and an IAM or STS ARN \
                     (arn:aws:iam::<account>:user/<name>), got {access_key_id:?} -> {arn:?}"
                ),
            ));
        }
        self.identities
            .insert(access_key_id.to_string(), arn.to_string());
        Ok(())
    }

    /// The identity behind an access key id: the registered one, else the IAM user
    /// `arn:aws:iam::<account>:user/<access key id>`.
    pub fn identity_of(&self, access_key_id: &str) -> CallerIdentity {
        let arn = self
            .identities
            .get(access_key_id)
            .cloned()
            .unwrap_or_else(|| {
                format!(
                    "arn:aws:iam::{}:user/{access_key_id}",
                    self.settings.account_id
                )
            });
        let account = arn
            .split(':')
            .nth(4)
            .filter(|a| a.len() == 12 && a.chars().all(|c| c.is_ascii_digit()))
            .unwrap_or(&self.settings.account_id)
            .to_string();
        let resource = arn.splitn(6, ':').nth(5).unwrap_or_default();
        let unique = |prefix: &str| format!("{prefix}{}", hex_id("", &[&arn]).to_uppercase());
        let user_id = if resource == "root" {
            account.clone()
        } else if let Some(rest) = resource.strip_prefix("assumed-role/") {
            let session = rest.split_once('/').map_or("", |(_, s)| s);
            format!("{}:{session}", unique("AROA"))
        } else if let Some(name) = resource.strip_prefix("federated-user/") {
            format!("{account}:{name}")
        } else if resource.starts_with("role/") {
            unique("AROA")
        } else {
            unique("AIDA")
        };
        CallerIdentity {
            arn,
            user_id,
            account,
        }
    }

    /// Routes one STS operation: the children of its `<{op}Result>`. `access_key_id` is the
    /// signature's; an unsigned request has none.
    pub fn sts_call(
        &mut self,
        access_key_id: Option<&str>,
        op: &str,
        q: &Query,
    ) -> Result<Vec<El>, ApiError> {
        match op {
            "GetCallerIdentity" => {
                let Some(akid) = access_key_id else {
                    return Err(ApiError::new(
                        403,
                        "MissingAuthenticationToken",
                        "Request is missing Authentication Token",
                    ));
                };
                let id = self.identity_of(akid);
                Ok(vec![
                    El::leaf("Arn", id.arn),
                    El::leaf("UserId", id.user_id),
                    El::leaf("Account", id.account),
                ])
            }
            other => Err(invalid_action(other, q)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::Settings;

    #[test]
    fn a_callers_user_id_and_account_follow_the_kind_of_its_arn() {
        // GIVEN an assumed-role session, another account's user and the root user registered
        let mut w = World::new(1, chrono::Utc::now(), Settings::default());
        w.put_identity(
            "AKIDROLE",
            "arn:aws:sts::123456789012:assumed-role/Admin/alice",
        )
        .expect("valid");
        w.put_identity("AKIDOTHER", "arn:aws:iam::210987654321:user/bob")
            .expect("valid");
        w.put_identity("AKIDROOT", "arn:aws:iam::123456789012:root")
            .expect("valid");
        // WHEN their identities are asked for, and an unregistered key's
        let role = w.identity_of("AKIDROLE");
        let other = w.identity_of("AKIDOTHER");
        let root = w.identity_of("AKIDROOT");
        let nobody = w.identity_of("AKIDNOBODY");
        // THEN each has STS's user id form and its ARN's account
        assert!(role.user_id.starts_with("AROA") && role.user_id.ends_with(":alice"));
        assert_eq!(role.user_id.len(), "AROA".len() + 17 + ":alice".len());
        assert_eq!(other.account, "210987654321");
        assert!(other.user_id.starts_with("AIDA"));
        assert_eq!(root.user_id, "123456789012");
        assert_eq!(nobody.arn, "arn:aws:iam::123456789012:user/AKIDNOBODY");
        assert_eq!(nobody.account, "123456789012");
        assert!(w.put_identity("AKID", "not-an-arn").is_err());
    }
}
