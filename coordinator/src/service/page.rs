//! Pages of the API's lists: every list route answers one bounded page (`limit`, 1 to
//! [`MAX_PAGE`], default [`DEFAULT_PAGE`]) in its list's order, and when more follow, the
//! opaque cursor that continues after it (the `X-Next-Cursor` header; `?cursor=` asks for the
//! next page). A cursor names its list and the last key of its page, so a page never repeats
//! or skips an item that existed throughout, whatever was added or removed meanwhile.

use super::{Result, ServiceError};
use crate::codes::Code;

/// Most items in one page.
pub const MAX_PAGE: u32 = 1000;
/// Items in a page when the query does not say.
pub const DEFAULT_PAGE: u32 = 500;
/// The header that carries the next page's cursor.
pub use clawfleet_api::routes::NEXT_CURSOR_HEADER;

pub use clawfleet_api::requests::PageQuery;

/// Which list a cursor continues: a cursor of one list is refused by another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum List {
    Namespaces,
    Agents,
    Revisions,
    Rollouts,
    Hosts,
    Clusters,
}

impl List {
    fn as_str(self) -> &'static str {
        match self {
            List::Namespaces => "namespaces",
            List::Agents => "agents",
            List::Revisions => "revisions",
            List::Rollouts => "rollouts",
            List::Hosts => "hosts",
            List::Clusters => "clusters",
        }
    }
}

/// A validated page request: the key the page starts after, and its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRequest {
    pub after: Option<String>,
    pub limit: u32,
}

/// One page of a list and the cursor of the next, if more follow.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next: Option<String>,
}

fn invalid(message: String) -> ServiceError {
    ServiceError::invalid(Code::InvalidQuery, message)
}

const CURSOR_REFUSED: &str = "is not a cursor of this list: pass the X-Next-Cursor header of the page before, or no cursor for the first page";

/// The cursor that continues `list` after `key`: opaque to clients (hex of the list's name
/// and the key).
pub fn cursor(list: List, key: &str) -> String {
    format!("{}\n{key}", list.as_str())
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode(list: List, text: &str) -> Option<String> {
    if !text.len().is_multiple_of(2) || text.len() > 512 {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        })
        .collect();
    let text = String::from_utf8(bytes?).ok()?;
    let (name, key) = text.split_once('\n')?;
    (name == list.as_str() && !key.is_empty() && !key.contains('\n')).then(|| key.to_owned())
}

/// A page query checked for its list.
pub trait PageQueryExt {
    /// The page asked for in `list`, or the refusal naming the parameter.
    fn request(&self, list: List) -> Result<PageRequest>;
}

impl PageQueryExt for PageQuery {
    fn request(&self, list: List) -> Result<PageRequest> {
        let limit = self.limit.unwrap_or(DEFAULT_PAGE);
        if !(1..=MAX_PAGE).contains(&limit) {
            return Err(invalid(format!(
                "limit: must be between 1 and {MAX_PAGE}, got {limit}"
            )));
        }
        let after = match &self.cursor {
            None => None,
            Some(c) => {
                Some(decode(list, c).ok_or_else(|| invalid(format!("cursor: {CURSOR_REFUSED}")))?)
            }
        };
        Ok(PageRequest { after, limit })
    }
}

/// A page of a list held whole: `items` ordered by `key` here (whatever order they came in),
/// the ones after the request's key, at most its limit.
pub fn page_of<T, K: Ord>(
    mut items: Vec<T>,
    list: List,
    req: &PageRequest,
    key: impl Fn(&T) -> K,
    parse: impl Fn(&str) -> Option<K>,
    text: impl Fn(&T) -> String,
) -> Result<Page<T>> {
    let after = match &req.after {
        Some(a) => Some(parse(a).ok_or_else(|| invalid(format!("cursor: {CURSOR_REFUSED}")))?),
        None => None,
    };
    items.sort_by_key(&key);
    if let Some(after) = &after {
        items.retain(|i| key(i) > *after);
    }
    Ok(from_ordered(items, list, req, text))
}

/// A page from items already ordered and starting after the request's key, with one more
/// than the limit when more follow (as a store's keyset query answers).
pub fn from_ordered<T>(
    mut items: Vec<T>,
    list: List,
    req: &PageRequest,
    text: impl Fn(&T) -> String,
) -> Page<T> {
    let limit = req.limit as usize;
    let next = if items.len() > limit {
        items.truncate(limit);
        items.last().map(|last| cursor(list, &text(last)))
    } else {
        None
    };
    Page { items, next }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(cursor: Option<&str>, limit: Option<u32>) -> PageQuery {
        PageQuery {
            cursor: cursor.map(str::to_owned),
            limit,
        }
    }

    #[test]
    fn a_cursor_continues_its_own_list_only() {
        let c = cursor(List::Agents, "a7");
        let req = q(Some(&c), Some(2)).request(List::Agents).unwrap();
        assert_eq!(req.after.as_deref(), Some("a7"));
        for bad in [c.as_str(), "zz", "abc", "", "00"] {
            let list = if bad == c { List::Hosts } else { List::Agents };
            let e = q(Some(bad), None).request(list).unwrap_err();
            assert!(e.to_string().contains("cursor: "), "{e}");
        }
        for limit in [0, MAX_PAGE + 1] {
            let e = q(None, Some(limit)).request(List::Agents).unwrap_err();
            assert!(e.to_string().contains("limit: "), "{e}");
        }
    }

    #[test]
    fn pages_cover_a_list_once_in_order() {
        let items: Vec<u64> = (1..=7).rev().collect();
        let mut seen = Vec::new();
        let mut query = q(None, Some(3));
        loop {
            let req = query.request(List::Revisions).unwrap();
            let page = page_of(
                items.clone(),
                List::Revisions,
                &req,
                |n| *n,
                |s| s.parse().ok(),
                u64::to_string,
            )
            .unwrap();
            assert!(page.items.len() <= 3);
            seen.extend(page.items);
            match page.next {
                Some(c) => query = q(Some(&c), Some(3)),
                None => break,
            }
        }
        assert_eq!(seen, (1..=7).collect::<Vec<_>>());
    }
}
