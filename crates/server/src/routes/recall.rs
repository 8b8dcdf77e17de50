//! Searching a task's journal (`GET /v1/tasks/{id}/journal?q=…`): the same search as the
//! `recall` tool and `skillstate search`, read through the runtime's `RecallReader`, so a
//! write-only value never appears and a hit that matched only through one is dropped.
//!
//! Every parameter is read here, one by one, so a bad one is a 422 naming it (`errors[0].pointer`
//! is `/<parameter>`: the query string read as an object of parameters).

use axum::Extension;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use skillstate_core::recall::{HitCursor, MAX_LIMIT, RecallKind, RecallQuery, tokens_of};
use skillstate_runtime::RecallReader;
use utoipa::{IntoParams, ToSchema};

use super::owned_task;
use crate::auth::Caller;
use crate::context::AppState;
use crate::json::ApiQuery;
use crate::problem::{ApiError, FieldError, Problem};
use crate::views::{HitKindName, JournalHit, JournalSearchPage, Redaction};

/// Hits per page when the caller gives no `limit`.
pub const DEFAULT_HIT_PAGE: usize = 20;

/// Which hits come first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SearchOrder {
    /// The latest steps first (the default).
    #[default]
    Newest,
    /// The earliest steps first.
    Oldest,
}

/// A journal search's parameters (read one by one by [`SearchParams::parse`]; this type only
/// describes them to the OpenAPI document).
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SearchJournalQuery {
    /// Words to find (at most 16, 512 bytes). Every word must match; a word is matched as its
    /// runs of letters and digits in a row, case folded (`item_4298` is `item 4298`). Give `q`,
    /// `pointer`, or both.
    #[param(max_length = 512, example = "item_4298")]
    pub q: Option<String>,
    /// Only state writes at or below this location (an RFC 6901 pointer such as
    /// `/inventory/shelf_122`; empty: the whole state).
    #[param(max_length = 512, example = "/inventory")]
    pub pointer: Option<String>,
    /// Only entries of these kinds (repeat the parameter, or separate with commas); with
    /// `pointer`, only `state`.
    #[param(explode, style = Form)]
    pub kind: Option<Vec<HitKindName>>,
    /// Only steps from this one on.
    #[param(minimum = 0)]
    pub from_step: Option<u64>,
    /// Only steps up to this one.
    #[param(minimum = 0)]
    pub to_step: Option<u64>,
    /// Hits per page (1-50, default 20).
    #[param(minimum = 1, maximum = 50)]
    pub limit: Option<u32>,
    /// `newest` (the default) or `oldest` first.
    pub order: Option<SearchOrder>,
    /// The `next_cursor` of the previous page, unchanged (with the same other parameters).
    pub cursor: Option<String>,
}

/// A 422 about one query parameter.
pub(crate) fn bad_parameter(name: &str, message: impl Into<String>) -> ApiError {
    let message = message.into();
    ApiError::invalid(
        format!("query parameter `{name}` {message}"),
        vec![FieldError::new("query", format!("/{name}"), message)],
    )
}

/// A search, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SearchParams {
    pub query: RecallQuery,
    pub after: Option<HitCursor>,
    pub limit: usize,
}

/// Takes the only value of a parameter that may be given once.
fn once(slot: &mut Option<String>, name: &str, value: String) -> Result<(), ApiError> {
    if slot.is_some() {
        return Err(bad_parameter(name, "is given twice; give it once"));
    }
    *slot = Some(value);
    Ok(())
}

fn step_number(name: &str, text: &str) -> Result<u64, ApiError> {
    text.parse::<u64>()
        .ok()
        .filter(|n| *n <= i64::MAX as u64)
        .ok_or_else(|| {
            bad_parameter(
                name,
                format!("is `{text}`, not a step number (a whole number, 0 or more)"),
            )
        })
}

/// The opaque cursor of the page after `hit`: the order it was made for, the step and the
/// entry.
fn cursor_text(order: SearchOrder, at: HitCursor) -> String {
    let mark = match order {
        SearchOrder::Newest => 'n',
        SearchOrder::Oldest => 'o',
    };
    format!("{mark}{}.{}", at.step, at.id)
}

fn parse_cursor(text: &str, order: SearchOrder) -> Result<HitCursor, ApiError> {
    let not_ours = || {
        bad_parameter(
            "cursor",
            "is not one this server gave; pass back `next_cursor` unchanged",
        )
    };
    let mut chars = text.chars();
    let made_for = match chars.next() {
        Some('n') => SearchOrder::Newest,
        Some('o') => SearchOrder::Oldest,
        _ => return Err(not_ours()),
    };
    let (step, id) = chars.as_str().split_once('.').ok_or_else(not_ours)?;
    let step = step.parse::<u64>().map_err(|_| not_ours())?;
    let id = id.parse::<i64>().map_err(|_| not_ours())?;
    if made_for != order {
        return Err(bad_parameter(
            "cursor",
            "was given for the other order; keep `order` as it was for the first page",
        ));
    }
    Ok(HitCursor { step, id })
}

impl SearchParams {
    /// Reads the query string's pairs; each problem is a 422 naming its parameter.
    pub(crate) fn parse(pairs: Vec<(String, String)>) -> Result<Self, ApiError> {
        let (mut q, mut pointer, mut from, mut to, mut limit, mut order, mut cursor) =
            (None, None, None, None, None, None, None);
        let mut kinds: Vec<RecallKind> = Vec::new();
        for (name, value) in pairs {
            match name.as_str() {
                "q" => once(&mut q, "q", value)?,
                "pointer" => once(&mut pointer, "pointer", value)?,
                "from_step" => once(&mut from, "from_step", value)?,
                "to_step" => once(&mut to, "to_step", value)?,
                "limit" => once(&mut limit, "limit", value)?,
                "order" => once(&mut order, "order", value)?,
                "cursor" => once(&mut cursor, "cursor", value)?,
                "kind" => {
                    for part in value.split(',') {
                        let kind = RecallKind::parse(part.trim()).ok_or_else(|| {
                            bad_parameter(
                                "kind",
                                format!(
                                    "has `{part}`; give observation, reasoning, action or state"
                                ),
                            )
                        })?;
                        if !kinds.contains(&kind) {
                            kinds.push(kind);
                        }
                    }
                }
                other => {
                    let shown: String = other.chars().take(64).collect();
                    return Err(bad_parameter(
                        &shown,
                        "is not a parameter of this route; it takes q, pointer, kind, from_step, to_step, limit, order, cursor",
                    ));
                }
            }
        }
        let mut query = RecallQuery::new(q.as_deref(), pointer.as_deref()).map_err(|problem| {
            let name = problem.field.trim_start_matches('/').to_owned();
            bad_parameter(&name, problem.message)
        })?;
        if query.pointer.is_some() {
            if kinds.iter().any(|k| *k != RecallKind::State) {
                return Err(bad_parameter(
                    "kind",
                    "cannot name kinds other than state with `pointer` (a pointer finds state writes only)",
                ));
            }
        } else {
            query.kinds = kinds;
        }
        query.from_step = from.map(|t| step_number("from_step", &t)).transpose()?;
        query.to_step = to.map(|t| step_number("to_step", &t)).transpose()?;
        if let (Some(from), Some(to)) = (query.from_step, query.to_step)
            && from > to
        {
            return Err(bad_parameter(
                "from_step",
                format!("is after to_step ({from} > {to}); give a range from the earlier step"),
            ));
        }
        let limit = match limit {
            None => DEFAULT_HIT_PAGE,
            Some(text) => text
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_LIMIT).contains(n))
                .ok_or_else(|| {
                    bad_parameter(
                        "limit",
                        format!("is `{text}`; give a whole number from 1 to {MAX_LIMIT}"),
                    )
                })?,
        };
        query.limit = limit;
        let order = match order.as_deref() {
            None | Some("newest") => SearchOrder::Newest,
            Some("oldest") => SearchOrder::Oldest,
            Some(other) => {
                return Err(bad_parameter(
                    "order",
                    format!("is `{other}`; give newest or oldest"),
                ));
            }
        };
        query.oldest_first = order == SearchOrder::Oldest;
        let after = cursor
            .as_deref()
            .map(|text| parse_cursor(text, order))
            .transpose()?;
        Ok(Self {
            query,
            after,
            limit,
        })
    }

    fn order(&self) -> SearchOrder {
        if self.query.oldest_first {
            SearchOrder::Oldest
        } else {
            SearchOrder::Newest
        }
    }
}

/// Whether every word's tokens still appear in a row among `text`'s tokens.
fn still_matches(text: &str, words: &[Vec<String>]) -> bool {
    let tokens = tokens_of(text);
    words.iter().all(|word| {
        !word.is_empty()
            && tokens
                .windows(word.len())
                .any(|window| window.iter().zip(word).all(|(a, b)| a == b))
    })
}

/// Searches a task's journal.
///
/// Finds, among the task's committed steps, the observations (tool results, events, users'
/// messages), the reasoning the model wrote, the actions and the state writes that contain
/// every word of `q` (and, with `pointer`, the state writes at or below that location).
/// Newest first unless `order=oldest`; one page at a time (`next_cursor`). A step that was
/// never committed is never found. Values the state schema marks `writeOnly` never appear,
/// and a hit that matched only through one is left out. A bad parameter is a 422 whose
/// `errors[0].pointer` is `/<parameter>`.
#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/journal",
    operation_id = "searchJournal",
    summary = "Search a task's journal",
    tag = "journal",
    params(("id" = String, Path, description = "The task's id"), SearchJournalQuery),
    responses(
        (status = 200, description = "A page of hits", body = JournalSearchPage),
        (status = 400, description = "The query string cannot be read", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "This API key is limited to board pointers", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A parameter is not valid; `errors[0].pointer` names it", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn search_journal(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiQuery(pairs): ApiQuery<Vec<(String, String)>>,
) -> Result<axum::Json<JournalSearchPage>, ApiError> {
    let params = SearchParams::parse(pairs)?;
    let task = owned_task(&state, &caller, &id).await?;
    let store = state.store.as_ref();
    let reader = RecallReader::of_task(store, &task).await?;
    let page = reader
        .search(store, &task.id, &params.query, params.after, params.limit)
        .await?;
    // The reader hides every write-only value the index and the state hold; the service also
    // knows those of rejected answers, and hides them as every other response does.
    let redaction = Redaction::of_history(store, &task, None).await?;
    let hits = page
        .hits
        .into_iter()
        .filter_map(|mut hit| {
            let shown = redaction.text(hit.text.clone());
            if shown != hit.text {
                if !still_matches(&shown, &params.query.word_tokens) {
                    return None;
                }
                hit.text = shown;
            }
            Some(JournalHit::of(hit))
        })
        .collect();
    Ok(axum::Json(JournalSearchPage {
        hits,
        next_cursor: page.next.map(|at| cursor_text(params.order(), at)),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn refused(list: &[(&str, &str)]) -> String {
        match SearchParams::parse(pairs(list)) {
            Err(ApiError::Invalid { errors, .. }) => errors[0].pointer.clone(),
            other => panic!("{list:?} was not refused: {other:?}"),
        }
    }

    #[test]
    fn every_bad_parameter_is_named() {
        assert_eq!(refused(&[]), "/q");
        assert_eq!(refused(&[("q", "  ")]), "/q");
        assert_eq!(refused(&[("q", "a"), ("q", "b")]), "/q");
        assert_eq!(refused(&[("pointer", "no-slash")]), "/pointer");
        assert_eq!(refused(&[("q", "a"), ("limit", "0")]), "/limit");
        assert_eq!(refused(&[("q", "a"), ("limit", "51")]), "/limit");
        assert_eq!(refused(&[("q", "a"), ("kind", "thought")]), "/kind");
        assert_eq!(
            refused(&[("pointer", "/a"), ("kind", "observation")]),
            "/kind"
        );
        assert_eq!(refused(&[("q", "a"), ("from_step", "-1")]), "/from_step");
        assert_eq!(
            refused(&[("q", "a"), ("from_step", "5"), ("to_step", "4")]),
            "/from_step"
        );
        assert_eq!(refused(&[("q", "a"), ("order", "random")]), "/order");
        assert_eq!(refused(&[("q", "a"), ("cursor", "12")]), "/cursor");
        assert_eq!(
            refused(&[("q", "a"), ("order", "oldest"), ("cursor", "n3.4")]),
            "/cursor"
        );
        assert_eq!(refused(&[("q", "a"), ("page", "2")]), "/page");
    }

    #[test]
    fn a_search_reads_every_parameter() {
        let params = SearchParams::parse(pairs(&[
            ("q", "item_4298 shelf"),
            ("kind", "observation,state"),
            ("kind", "action"),
            ("from_step", "3"),
            ("to_step", "90"),
            ("limit", "7"),
            ("order", "oldest"),
            ("cursor", "o12.345"),
        ]))
        .unwrap();
        assert_eq!(params.query.words, vec!["item_4298", "shelf"]);
        assert_eq!(
            params.query.kinds,
            vec![
                RecallKind::Observation,
                RecallKind::State,
                RecallKind::Action
            ]
        );
        assert_eq!(
            (params.query.from_step, params.query.to_step),
            (Some(3), Some(90))
        );
        assert_eq!((params.limit, params.query.oldest_first), (7, true));
        assert_eq!(params.after, Some(HitCursor { step: 12, id: 345 }));
        let cursor = cursor_text(SearchOrder::Oldest, HitCursor { step: 12, id: 345 });
        assert_eq!(parse_cursor(&cursor, SearchOrder::Oldest).unwrap().id, 345);
        let by_pointer = SearchParams::parse(pairs(&[("pointer", "/inventory")])).unwrap();
        assert_eq!(by_pointer.query.kinds, vec![RecallKind::State]);
        assert_eq!(by_pointer.limit, DEFAULT_HIT_PAGE);
    }

    #[test]
    fn a_scrubbed_hit_is_checked_again() {
        let words = vec![vec!["item".to_owned(), "42".to_owned()]];
        assert!(still_matches("moved item_42 to shelf 3", &words));
        assert!(!still_matches("moved [redacted] to shelf 3", &words));
    }
}
