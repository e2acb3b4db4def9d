//! Who may call a route: the route table gives each route an [`Access`]; the coordinator
//! checks it before the handler runs.

use crate::model::Role;

/// The rule a route's caller must meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No token needed.
    Public,
    /// Any valid token; the handler shows only what the token's grants cover.
    Token,
    /// The role in every Namespace (a `"*"` grant).
    Global(Role),
    /// The role in the Namespace named by the path's `{ns}`.
    Namespace(Role),
    /// The role in at least one Namespace; the handler checks the Namespace the body names.
    Scoped(Role),
}

impl Access {
    /// The role the rule needs, if any.
    pub fn role(self) -> Option<Role> {
        match self {
            Access::Public | Access::Token => None,
            Access::Global(r) | Access::Namespace(r) | Access::Scoped(r) => Some(r),
        }
    }

    /// A short description for `/openapi.json` (`x-clawfleet-access`).
    pub fn describe(self) -> String {
        match self {
            Access::Public => "none".to_owned(),
            Access::Token => "any token".to_owned(),
            Access::Global(r) => format!("{} in all Namespaces", r.as_str()),
            Access::Namespace(r) => format!("{} in the Namespace {{ns}}", r.as_str()),
            Access::Scoped(r) => format!("{} in the Namespace the body names", r.as_str()),
        }
    }
}
