//! The admin-panel environment: a simulated web admin panel of a publication site, for the
//! post-scheduler skill (docs/admin-panel.md, "Example: the admin-panel agent"). Pages (routes): the post
//! list, the category list and the post editor, whose form validates what is typed into it.
//! Saving a post and (re)scheduling one change the site, so their tools are declared
//! approval-required: the runtime commits such an action as a pending intent, pauses the task
//! and runs the tool only on `approve` — a rejection, or a message written instead of a
//! decision, leaves the site as it was. Nothing is saved without a human's confirmation.
//!
//! The site (its name, categories and earlier posts) is drawn from the seed; the panel's clock
//! stands still at `now`, so every run of the same actions gives the same pages.

pub mod dates;

use std::sync::{Arc, Mutex};

use crate::lock;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use skillstate_tools::{
    CallContext, Environment, EnvironmentError, SideEffect, Tool, ToolError, ToolOutput, ToolSpec,
};

use crate::params::{ParamSpec, Params};
use crate::rng::SeededRng;
use dates::{Day, parse_timestamp};

pub const KIND: &str = "admin_panel";

/// Default clock of the panel.
pub const DEFAULT_NOW: &str = "2026-10-01T12:00:00Z";

const SITES: [&str; 4] = [
    "Northwind Journal",
    "Acme Newsroom",
    "Lumen Blog",
    "Harbor Notes",
];

/// Category names; "Product updates" is always among the site's categories.
const CATEGORIES: [&str; 7] = [
    "Company news",
    "Engineering",
    "Events",
    "Customer stories",
    "Tutorials",
    "Security",
    "Hiring",
];

const EARLIER_TITLES: [&str; 6] = [
    "What we learned from our first user conference",
    "Faster search for large workspaces",
    "Meet the support team",
    "A new home for the developer docs",
    "How we keep your data safe",
    "Spring hackathon results",
];

pub const TITLE_MAX: usize = 80;
pub const BODY_MIN: usize = 40;

/// The admin panel's `[environment]` parameters.
pub const PARAMETERS: &[ParamSpec] = &[
    ParamSpec::whole("seed", 0, 0, u64::MAX),
    ParamSpec::text("now", &[DEFAULT_NOW, "2027-02-28T23:59:59Z"]),
    ParamSpec::text(
        "request",
        &["Schedule a post announcing the new dashboard for next Monday at 09:00."],
    ),
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminPanelConfig {
    pub seed: u64,
    /// The panel's clock (UTC, `YYYY-MM-DDTHH:MM:SSZ`); publication times must be after it.
    pub now: String,
    /// The user's request that opens the task (`skillstate run … --input`).
    #[serde(default)]
    pub request: Option<String>,
}

impl AdminPanelConfig {
    pub fn from_params(params: &Map<String, Value>) -> Result<Self, EnvironmentError> {
        let p = Params::new(KIND, PARAMETERS, params);
        let seed = p.u64("seed")?;
        let now = p
            .optional_text("now")?
            .unwrap_or_else(|| DEFAULT_NOW.to_owned());
        let request = p.optional_text("request")?;
        p.finish()?;
        parse_timestamp(&now).map_err(|message| EnvironmentError::Config {
            kind: KIND.into(),
            message: format!("[environment] now: {message}"),
        })?;
        Ok(Self { seed, now, request })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Category {
    pub id: u64,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Draft,
    Scheduled,
    Published,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Draft => "draft",
            Status::Scheduled => "scheduled",
            Status::Published => "published",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Post {
    pub id: u64,
    pub title: String,
    pub body: String,
    pub category_id: u64,
    pub publish_at: Option<String>,
    pub status: Status,
    /// Written by the agent (saved or rescheduled during the task).
    #[serde(default)]
    pub touched: bool,
}

/// The editor form's fields, as the page shows them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FormValues {
    pub title: Option<String>,
    pub body: Option<String>,
    #[serde(rename = "categoryId")]
    pub category_id: Option<u64>,
    #[serde(rename = "publishAt")]
    pub publish_at: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Editor {
    /// The post being edited; `None` for a new one.
    post_id: Option<u64>,
    values: FormValues,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Panel {
    config: AdminPanelConfig,
    site: String,
    categories: Vec<Category>,
    posts: Vec<Post>,
    next_id: u64,
    /// The page open: `dashboard`, `posts`, `categories` or `editor`.
    route: String,
    editor: Option<Editor>,
    /// Saves and schedules carried out (each one approved by a human).
    changes: u32,
}

/// The site a seed gives: its name, categories (ids ascending, "Product updates" among them)
/// and earlier posts (published before `now`, one scheduled after it, one draft).
fn site(config: &AdminPanelConfig) -> (String, Vec<Category>, Vec<Post>) {
    let mut rng = SeededRng::new(config.seed ^ 0xAD_0000_0001);
    let name = rng.pick(&SITES).to_string();
    let mut names: Vec<&str> = CATEGORIES.to_vec();
    let mut chosen = vec!["Product updates"];
    for _ in 0..3 {
        chosen.push(names.remove(rng.index(names.len())));
    }
    // Distinct ids in 1..=40, handed out in a seeded order.
    let mut ids: Vec<u64> = Vec::new();
    while ids.len() < chosen.len() {
        let id = 1 + rng.below(40);
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    let mut categories: Vec<Category> = chosen
        .iter()
        .zip(&ids)
        .map(|(name, id)| Category {
            id: *id,
            name: (*name).to_owned(),
        })
        .collect();
    categories.sort_by_key(|c| c.id);
    let today = parse_timestamp(&config.now).unwrap_or(Day {
        year: 2026,
        month: 10,
        day: 1,
    });
    let mut titles: Vec<&str> = EARLIER_TITLES.to_vec();
    let first_id = 10 + rng.below(30);
    let mut posts = Vec::new();
    for k in 0..4u64 {
        let title = titles.remove(rng.index(titles.len())).to_owned();
        let category = rng.pick(&categories).id;
        let (status, publish_at) = match k {
            // Published in the two months before now, oldest first.
            0 | 1 => (
                Status::Published,
                Some(
                    today
                        .plus_days(-(60 - 25 * k as i64) - rng.below(10) as i64)
                        .at("09:00:00"),
                ),
            ),
            // Scheduled six to eight weeks ahead.
            2 => (
                Status::Scheduled,
                Some(today.plus_days(42 + rng.below(14) as i64).at("09:00:00")),
            ),
            _ => (Status::Draft, None),
        };
        posts.push(Post {
            id: first_id + k,
            body: format!("{title}. The full story, with pictures and links, for our readers."),
            title,
            category_id: category,
            publish_at,
            status,
            touched: false,
        });
    }
    (name, categories, posts)
}

impl Panel {
    fn new(config: AdminPanelConfig) -> Self {
        let (site, categories, posts) = site(&config);
        let next_id = posts.iter().map(|p| p.id).max().unwrap_or(0) + 1;
        Self {
            config,
            site,
            categories,
            posts,
            next_id,
            route: "dashboard".into(),
            editor: None,
            changes: 0,
        }
    }

    fn category_list(&self) -> String {
        self.categories
            .iter()
            .map(|c| format!("{} {}", c.id, c.name))
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn category_name(&self, id: u64) -> &str {
        self.categories
            .iter()
            .find(|c| c.id == id)
            .map(|c| c.name.as_str())
            .unwrap_or("?")
    }

    /// Required fields the form leaves empty.
    fn missing(values: &FormValues) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if values.title.as_deref().is_none_or(|t| t.trim().is_empty()) {
            missing.push("title");
        }
        if values.body.as_deref().is_none_or(|b| b.trim().is_empty()) {
            missing.push("body");
        }
        if values.category_id.is_none() {
            missing.push("categoryId");
        }
        missing
    }

    /// What is wrong with the values the form holds, field by field.
    fn errors(&self, values: &FormValues) -> Vec<String> {
        let mut errors = Vec::new();
        if let Some(title) = &values.title {
            let len = title.chars().count();
            if len > TITLE_MAX {
                errors.push(format!(
                    "title: {len} characters; at most {TITLE_MAX} are allowed"
                ));
            }
        }
        if let Some(body) = &values.body {
            let len = body.trim().chars().count();
            if len > 0 && len < BODY_MIN {
                errors.push(format!(
                    "body: {len} characters; at least {BODY_MIN} are needed"
                ));
            }
        }
        if let Some(id) = values.category_id
            && !self.categories.iter().any(|c| c.id == id)
        {
            errors.push(format!(
                "categoryId: there is no category {id} (categories: {})",
                self.category_list()
            ));
        }
        // The value is not repeated: the form shows it, and an error that quoted a date would
        // be one more copy of it wherever the error is kept.
        if let Some(at) = &values.publish_at {
            match parse_timestamp(at) {
                Err(_) => errors
                    .push("publishAt: not a real UTC time written YYYY-MM-DDTHH:MM:SSZ".to_owned()),
                Ok(_) if at.as_str() <= self.config.now.as_str() => {
                    errors.push("publishAt: not after now; choose a later time".to_owned())
                }
                Ok(_) => {}
            }
        }
        errors
    }

    fn list_or_none(items: &[String]) -> String {
        if items.is_empty() {
            "none".into()
        } else {
            items.join("; ")
        }
    }

    fn editor_page(&self) -> String {
        let Some(editor) = &self.editor else {
            return "Page: dashboard".into();
        };
        let which = match editor.post_id {
            Some(id) => format!("post #{id}"),
            None => "new post".into(),
        };
        let missing: Vec<String> = Self::missing(&editor.values)
            .into_iter()
            .map(str::to_owned)
            .collect();
        let form = serde_json::to_string(&editor.values).unwrap_or_default();
        format!(
            "Page: editor ({which})\nForm: {form}\nMissing: {}\nErrors: {}\nCategories: {}\nFields: title (required, at most {TITLE_MAX} characters); body (required, at least {BODY_MIN} characters); categoryId (required, one of the categories); publishAt (optional: a UTC time YYYY-MM-DDTHH:MM:SSZ after now, {}; set to schedule the post, null to keep it a draft). Saving needs the user's confirmation.",
            Self::list_or_none(&missing),
            Self::list_or_none(&self.errors(&editor.values)),
            self.category_list(),
            self.config.now,
        )
    }

    fn post_line(&self, post: &Post) -> String {
        let when = match (&post.publish_at, post.status) {
            (Some(at), Status::Draft) => format!("draft (publishAt {at})"),
            (Some(at), status) => format!("{} {at}", status.as_str()),
            (None, status) => status.as_str().to_owned(),
        };
        format!(
            "#{} \"{}\" · {} · {when}",
            post.id,
            post.title,
            self.category_name(post.category_id)
        )
    }

    fn posts_page(&self) -> String {
        let mut lines = vec!["Page: posts".to_owned()];
        lines.extend(self.posts.iter().rev().map(|p| self.post_line(p)));
        lines.join("\n")
    }

    fn categories_page(&self) -> String {
        let mut lines = vec!["Page: categories".to_owned()];
        lines.extend(
            self.categories
                .iter()
                .map(|c| format!("{} {}", c.id, c.name)),
        );
        lines.join("\n")
    }

    fn opening(&self) -> String {
        let count = |status: Status| self.posts.iter().filter(|p| p.status == status).count();
        let mut lines = vec![
            format!(
                "Admin panel of {} — now {} (UTC). Page: dashboard.",
                self.site, self.config.now
            ),
            format!(
                "Posts: {} published, {} scheduled, {} draft. Pages: posts, categories, editor.",
                count(Status::Published),
                count(Status::Scheduled),
                count(Status::Draft)
            ),
        ];
        match &self.config.request {
            Some(request) => lines.push(format!("Request from the user: {request}")),
            None => lines.push("No request from the user yet.".into()),
        }
        lines.join("\n")
    }

    fn navigate(&mut self, route: &str, post_id: Option<u64>) -> Result<String, String> {
        match route {
            "posts" => {
                self.route = route.into();
                Ok(self.posts_page())
            }
            "categories" => {
                self.route = route.into();
                Ok(self.categories_page())
            }
            "editor" => {
                let values = match post_id {
                    None => FormValues::default(),
                    Some(id) => {
                        let post = self.posts.iter().find(|p| p.id == id).ok_or_else(|| {
                            format!("Error: there is no post #{id}; nothing changed.")
                        })?;
                        if post.status == Status::Published {
                            return Err(format!(
                                "Error: post #{id} is published and can no longer be edited; nothing changed."
                            ));
                        }
                        FormValues {
                            title: Some(post.title.clone()),
                            body: Some(post.body.clone()),
                            category_id: Some(post.category_id),
                            publish_at: post.publish_at.clone(),
                        }
                    }
                };
                self.route = route.into();
                self.editor = Some(Editor { post_id, values });
                Ok(self.editor_page())
            }
            other => Err(format!(
                "Error: there is no page `{other}` (pages: posts, categories, editor); nothing changed."
            )),
        }
    }

    fn fill(&mut self, values: &Map<String, Value>) -> Result<String, String> {
        let Some(editor) = self.editor.as_mut().filter(|_| self.route == "editor") else {
            return Err(
                "Error: the editor is not open; navigate to the editor first. Nothing changed."
                    .into(),
            );
        };
        for (field, value) in values {
            match field.as_str() {
                "title" => editor.values.title = value.as_str().map(str::to_owned),
                "body" => editor.values.body = value.as_str().map(str::to_owned),
                "categoryId" => editor.values.category_id = value.as_u64(),
                "publishAt" => editor.values.publish_at = value.as_str().map(str::to_owned),
                other => {
                    return Err(format!(
                        "Error: the form has no field `{other}` (fields: title, body, categoryId, publishAt); nothing changed."
                    ));
                }
            }
        }
        Ok(self.editor_page())
    }

    /// Saves the editor form. `confirmed` are the values the human approved: the panel saves
    /// exactly those, so they must be what the form holds.
    fn save(&mut self, post_id: Option<u64>, confirmed: &FormValues) -> Result<String, String> {
        let Some(editor) = self.editor.clone().filter(|_| self.route == "editor") else {
            return Err("Not saved: the editor is not open; nothing changed.".into());
        };
        if editor.post_id != post_id {
            return Err(format!(
                "Not saved: the editor holds {}, not {}; nothing changed.",
                editor
                    .post_id
                    .map_or("a new post".to_owned(), |id| format!("post #{id}")),
                post_id.map_or("a new post".to_owned(), |id| format!("post #{id}")),
            ));
        }
        if editor.values != *confirmed {
            return Err(format!(
                "Not saved: the confirmed values differ from the form (form: {}); fill the form, then ask for confirmation again. Nothing changed.",
                serde_json::to_string(&editor.values).unwrap_or_default()
            ));
        }
        let missing = Self::missing(&editor.values);
        let errors = self.errors(&editor.values);
        if !missing.is_empty() || !errors.is_empty() {
            return Err(format!(
                "Not saved: the form is not valid (missing: {}; errors: {}); nothing changed.",
                Self::list_or_none(&missing.iter().map(|m| (*m).to_owned()).collect::<Vec<_>>()),
                Self::list_or_none(&errors)
            ));
        }
        let values = editor.values;
        let status = if values.publish_at.is_some() {
            Status::Scheduled
        } else {
            Status::Draft
        };
        let post = Post {
            id: post_id.unwrap_or(self.next_id),
            title: values.title.clone().unwrap_or_default(),
            body: values.body.clone().unwrap_or_default(),
            category_id: values.category_id.unwrap_or_default(),
            publish_at: values.publish_at.clone(),
            status,
            touched: true,
        };
        let id = post.id;
        match self.posts.iter_mut().find(|p| p.id == id) {
            Some(existing) => *existing = post.clone(),
            None => {
                self.posts.push(post.clone());
                self.next_id += 1;
            }
        }
        // Saving closes the editor and returns to the post list.
        self.editor = None;
        self.route = "posts".into();
        self.changes += 1;
        let when = match &post.publish_at {
            Some(at) => format!("scheduled for {at}"),
            None => "saved as a draft".into(),
        };
        Ok(format!(
            "Saved post #{id} \"{}\" in {}: {when}. Page: posts.",
            post.title,
            self.category_name(post.category_id)
        ))
    }

    fn schedule(&mut self, post_id: u64, at: &str) -> Result<String, String> {
        let now = self.config.now.clone();
        let post = self
            .posts
            .iter_mut()
            .find(|p| p.id == post_id)
            .ok_or_else(|| {
                format!("Not scheduled: there is no post #{post_id}; nothing changed.")
            })?;
        if post.status == Status::Published {
            return Err(format!(
                "Not scheduled: post #{post_id} is already published; nothing changed."
            ));
        }
        parse_timestamp(at)
            .map_err(|m| format!("Not scheduled: publishAt {m}; nothing changed."))?;
        if at <= now.as_str() {
            return Err(format!(
                "Not scheduled: {at} is not after now ({now}); nothing changed."
            ));
        }
        post.publish_at = Some(at.to_owned());
        post.status = Status::Scheduled;
        post.touched = true;
        let title = post.title.clone();
        if let Some(editor) = self.editor.as_mut().filter(|e| e.post_id == Some(post_id)) {
            editor.values.publish_at = Some(at.to_owned());
        }
        self.changes += 1;
        Ok(format!(
            "Post #{post_id} \"{title}\" is scheduled for {at}."
        ))
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Navigate,
    FillForm,
    SavePost,
    SchedulePost,
}

fn form_properties() -> Value {
    json!({
        "title": {"type": ["string", "null"]},
        "body": {"type": ["string", "null"]},
        "categoryId": {"type": ["integer", "null"], "minimum": 1},
        "publishAt": {"type": ["string", "null"]}
    })
}

fn spec(op: Op) -> ToolSpec {
    let post_id = json!({"type": ["integer", "null"], "minimum": 1});
    let (name, description, properties, side_effect, needs_approval) = match op {
        Op::Navigate => (
            "navigate",
            "Open a page of the admin panel: `posts` (the post list), `categories`, or `editor` (postId null for a new post, else that post). Returns the page.",
            json!({"route": {"enum": ["posts", "categories", "editor"]}, "postId": post_id}),
            SideEffect::ReadOnly,
            false,
        ),
        Op::FillForm => (
            "fill_form",
            "Type values into the open editor form (only the fields given; null empties a field). Returns the form with its missing fields and validation errors. Saves nothing.",
            json!({"values": {
                "type": "object",
                "properties": form_properties(),
                "additionalProperties": false,
                "minProperties": 1
            }}),
            SideEffect::Idempotent,
            false,
        ),
        Op::SavePost => (
            "save_post",
            "Save the editor form: a post with publishAt is scheduled, one without stays a draft. `values` must be exactly what the form holds. Needs the user's confirmation: the task pauses until the user approves or rejects.",
            json!({"postId": post_id, "values": {
                "type": "object",
                "properties": form_properties(),
                "required": ["title", "body", "categoryId", "publishAt"],
                "additionalProperties": false
            }}),
            SideEffect::Effectful,
            true,
        ),
        Op::SchedulePost => (
            "schedule_post",
            "Set the publication time of a saved post (it becomes scheduled). Needs the user's confirmation: the task pauses until the user approves or rejects.",
            json!({"postId": {"type": "integer", "minimum": 1}, "publishAt": {"type": "string"}}),
            SideEffect::Idempotent,
            true,
        ),
    };
    let mut spec = crate::env_tool(KIND, name, description, properties, side_effect);
    spec.needs_approval = needs_approval;
    spec
}

struct PanelTool {
    op: Op,
    spec: ToolSpec,
    panel: Arc<Mutex<Panel>>,
}

#[async_trait]
impl Tool for PanelTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: &Value, _ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let post_id = args.get("postId").and_then(Value::as_u64);
        let mut panel = lock(&self.panel);
        let result = match self.op {
            Op::Navigate => panel.navigate(
                args.get("route")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
                post_id,
            ),
            Op::FillForm => match args.get("values").and_then(Value::as_object) {
                Some(values) => panel.fill(values),
                None => {
                    Err("Error: `values` must be an object of form fields; nothing changed.".into())
                }
            },
            Op::SavePost => {
                match serde_json::from_value::<FormValues>(
                    args.get("values").cloned().unwrap_or(Value::Null),
                ) {
                    Ok(values) => panel.save(post_id, &values),
                    Err(e) => Err(format!(
                        "Not saved: `values` is not a form: {e}; nothing changed."
                    )),
                }
            }
            Op::SchedulePost => match post_id {
                Some(id) => panel.schedule(
                    id,
                    args.get("publishAt")
                        .and_then(Value::as_str)
                        .unwrap_or_default(),
                ),
                None => {
                    Err("Not scheduled: `postId` must name a saved post; nothing changed.".into())
                }
            },
        };
        Ok(match result {
            Ok(text) => ToolOutput::success(text),
            Err(text) => ToolOutput::failure(text),
        })
    }
}

pub struct AdminPanel {
    panel: Arc<Mutex<Panel>>,
    tools: Vec<Arc<dyn Tool>>,
}

impl AdminPanel {
    pub fn new(config: AdminPanelConfig) -> Self {
        let panel = Arc::new(Mutex::new(Panel::new(config)));
        let tools = [Op::Navigate, Op::FillForm, Op::SavePost, Op::SchedulePost]
            .into_iter()
            .map(|op| {
                Arc::new(PanelTool {
                    op,
                    spec: spec(op),
                    panel: Arc::clone(&panel),
                }) as Arc<dyn Tool>
            })
            .collect();
        Self { panel, tools }
    }

    /// The posts of the site as they stand (earlier ones and those the agent saved).
    pub fn posts(&self) -> Vec<Post> {
        lock(&self.panel).posts.clone()
    }

    pub fn categories(&self) -> Vec<Category> {
        lock(&self.panel).categories.clone()
    }
}

impl Environment for AdminPanel {
    fn kind(&self) -> &str {
        KIND
    }

    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.tools.clone()
    }

    fn opening_observation(&mut self) -> String {
        lock(&self.panel).opening()
    }

    fn after_action(&mut self) -> Option<String> {
        // The clock stands still and nobody else edits the site: nothing arrives on its own.
        None
    }

    fn episode_over(&self) -> bool {
        false
    }

    fn outcome(&self) -> Value {
        let panel = lock(&self.panel);
        let posts: Vec<Value> = panel
            .posts
            .iter()
            .filter(|p| p.touched)
            .map(|p| {
                json!({
                    "id": p.id,
                    "title": p.title,
                    "categoryId": p.category_id,
                    "publishAt": p.publish_at,
                    "status": p.status.as_str(),
                })
            })
            .collect();
        json!({"posts": posts, "changes": panel.changes})
    }

    fn checkpoint(&self) -> Value {
        serde_json::to_value(&*lock(&self.panel)).unwrap_or(Value::Null)
    }

    fn restore(&mut self, checkpoint: &Value) -> Result<(), EnvironmentError> {
        let restored: Panel =
            serde_json::from_value(checkpoint.clone()).map_err(|e| EnvironmentError::Restore {
                kind: KIND.into(),
                message: e.to_string(),
            })?;
        *lock(&self.panel) = restored;
        Ok(())
    }

    fn replayable(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests;
