use super::*;

fn panel(seed: u64) -> AdminPanel {
    AdminPanel::new(AdminPanelConfig {
        seed,
        now: DEFAULT_NOW.into(),
        request: Some("Prepare a post about the launch".into()),
    })
}

async fn call(env: &AdminPanel, tool: &str, args: Value) -> ToolOutput {
    let tools = env.tools();
    skillstate_tools::find_tool(&tools, tool)
        .unwrap()
        .call(&args, &CallContext::new("t", 1))
        .await
        .unwrap()
}

fn product_category(env: &AdminPanel) -> u64 {
    env.categories()
        .iter()
        .find(|c| c.name == "Product updates")
        .unwrap()
        .id
}

fn values(category: u64, at: Option<&str>) -> Value {
    json!({
        "title": "The new product is here",
        "body": "Everything about the new product, what it does and how to get it.",
        "categoryId": category,
        "publishAt": at,
    })
}

#[test]
fn sites_are_deterministic_per_seed() {
    let a = Panel::new(panel(3).panel.lock().unwrap().config.clone());
    let b = Panel::new(panel(3).panel.lock().unwrap().config.clone());
    assert_eq!(a, b);
    let c = Panel::new(panel(4).panel.lock().unwrap().config.clone());
    assert_ne!(a.categories, c.categories);
    assert_eq!(a.categories.len(), 4);
    assert!(a.categories.windows(2).all(|w| w[0].id < w[1].id));
    assert!(a.categories.iter().any(|c| c.name == "Product updates"));
    // Earlier posts: two published before now, one scheduled after it, one draft.
    let now = DEFAULT_NOW;
    let published: Vec<_> = a
        .posts
        .iter()
        .filter(|p| p.status == Status::Published)
        .collect();
    assert_eq!(published.len(), 2);
    assert!(
        published
            .iter()
            .all(|p| p.publish_at.as_deref().unwrap() < now)
    );
    assert!(
        a.posts
            .iter()
            .filter(|p| p.status == Status::Scheduled)
            .all(|p| p.publish_at.as_deref().unwrap() > now)
    );
}

#[test]
fn parameters_are_checked() {
    let mut params = Map::new();
    params.insert("now".into(), json!("2026-10-01"));
    let err = AdminPanelConfig::from_params(&params).unwrap_err();
    assert!(err.to_string().contains("[environment] now"), "{err}");
    let mut params = Map::new();
    params.insert("requests".into(), json!("x"));
    let err = AdminPanelConfig::from_params(&params).unwrap_err();
    assert!(
        err.to_string().contains("unknown parameter `requests`"),
        "{err}"
    );
    let config = AdminPanelConfig::from_params(&Map::new()).unwrap();
    assert_eq!(config.now, DEFAULT_NOW);
    assert_eq!(config.request, None);
}

#[tokio::test]
async fn the_form_reports_missing_fields_and_validation_errors() {
    let mut env = panel(1);
    let opening = env.opening_observation();
    assert!(
        opening.contains("Request from the user: Prepare a post about the launch"),
        "{opening}"
    );
    let filled = call(&env, "fill_form", json!({"values": {"title": "x"}})).await;
    assert!(
        !filled.ok && filled.text.contains("editor is not open"),
        "{}",
        filled.text
    );

    let page = call(&env, "navigate", json!({"route": "editor", "postId": null})).await;
    assert!(page.ok, "{}", page.text);
    assert!(
        page.text.contains("Missing: title; body; categoryId"),
        "{}",
        page.text
    );
    assert!(page.text.contains("Errors: none"), "{}", page.text);

    let page = call(
        &env,
        "fill_form",
        json!({"values": {"title": "Launch", "body": "Too short.", "categoryId": 999, "publishAt": "2026-09-15T09:00:00Z"}}),
    )
    .await;
    assert!(page.text.contains("Missing: none"), "{}", page.text);
    assert!(
        page.text.contains("body: 10 characters; at least 40"),
        "{}",
        page.text
    );
    assert!(
        page.text.contains("categoryId: there is no category 999"),
        "{}",
        page.text
    );
    // The errors name the field and the rule, never the date: the form line shows it, and an
    // error kept in the agent's state must not be a second copy of it.
    let errors = page
        .text
        .lines()
        .find(|l| l.starts_with("Errors: "))
        .unwrap();
    assert!(
        errors.ends_with("; publishAt: not after now; choose a later time"),
        "{errors}"
    );
    assert!(!errors.contains("2026-09-15"), "{errors}");
    let page = call(
        &env,
        "fill_form",
        json!({"values": {"publishAt": "tomorrow"}}),
    )
    .await;
    assert!(
        page.text
            .contains("publishAt: not a real UTC time written YYYY-MM-DDTHH:MM:SSZ"),
        "{}",
        page.text
    );

    // An invalid form is never saved, even when approved.
    let category = product_category(&env);
    let bad = json!({"title": "Launch", "body": "Too short.", "categoryId": 999, "publishAt": "tomorrow"});
    let saved = call(&env, "save_post", json!({"postId": null, "values": bad})).await;
    assert!(
        !saved.ok && saved.text.contains("not valid"),
        "{}",
        saved.text
    );
    assert_eq!(env.outcome()["changes"], 0);

    // Values other than the form's are refused: what is saved is what was confirmed.
    let good = values(category, Some("2026-10-15T09:00:00Z"));
    let saved = call(&env, "save_post", json!({"postId": null, "values": good})).await;
    assert!(
        !saved.ok && saved.text.contains("differ from the form"),
        "{}",
        saved.text
    );
    assert_eq!(env.outcome()["changes"], 0);
}

#[tokio::test]
async fn saving_schedules_and_rescheduling_changes_one_field() {
    let env = panel(2);
    let category = product_category(&env);
    let before = env.posts().len();
    call(&env, "navigate", json!({"route": "editor", "postId": null})).await;
    let form = values(category, Some("2026-10-15T09:00:00Z"));
    let page = call(&env, "fill_form", json!({"values": form})).await;
    assert!(
        page.text.contains("Missing: none") && page.text.contains("Errors: none"),
        "{}",
        page.text
    );
    let saved = call(&env, "save_post", json!({"postId": null, "values": form})).await;
    assert!(saved.ok, "{}", saved.text);
    let posts = env.posts();
    assert_eq!(posts.len(), before + 1);
    let post = posts.last().unwrap().clone();
    assert_eq!(post.status, Status::Scheduled);
    assert_eq!(post.publish_at.as_deref(), Some("2026-10-15T09:00:00Z"));
    assert_eq!(
        saved.text,
        format!(
            "Saved post #{} \"The new product is here\" in Product updates: scheduled for 2026-10-15T09:00:00Z. Page: posts.",
            post.id
        )
    );

    let moved = call(
        &env,
        "schedule_post",
        json!({"postId": post.id, "publishAt": "2026-10-20T09:00:00Z"}),
    )
    .await;
    assert!(moved.ok, "{}", moved.text);
    assert!(
        !moved.text.contains("10-15"),
        "the answer names only the new time: {}",
        moved.text
    );
    let after = env.posts().last().unwrap().clone();
    assert_eq!(
        after,
        Post {
            publish_at: Some("2026-10-20T09:00:00Z".into()),
            ..post.clone()
        },
        "only publishAt changed"
    );
    assert_eq!(env.outcome()["changes"], 2);
    assert_eq!(
        env.outcome()["posts"][0]["publishAt"],
        "2026-10-20T09:00:00Z"
    );

    // Past times, unknown and published posts are refused.
    let past = call(
        &env,
        "schedule_post",
        json!({"postId": post.id, "publishAt": "2026-09-01T09:00:00Z"}),
    )
    .await;
    assert!(
        !past.ok && past.text.contains("not after now"),
        "{}",
        past.text
    );
    let published = env
        .posts()
        .into_iter()
        .find(|p| p.status == Status::Published)
        .unwrap();
    let refused = call(
        &env,
        "schedule_post",
        json!({"postId": published.id, "publishAt": "2026-12-01T09:00:00Z"}),
    )
    .await;
    assert!(
        !refused.ok && refused.text.contains("already published"),
        "{}",
        refused.text
    );
    let unknown = call(
        &env,
        "schedule_post",
        json!({"postId": 9999, "publishAt": "2026-12-01T09:00:00Z"}),
    )
    .await;
    assert!(
        !unknown.ok && unknown.text.contains("no post #9999"),
        "{}",
        unknown.text
    );
    assert_eq!(env.outcome()["changes"], 2);

    // The list shows the post with its new time; a checkpoint carries everything.
    let list = call(&env, "navigate", json!({"route": "posts", "postId": null})).await;
    assert!(
        list.text.contains(&format!(
            "#{} \"The new product is here\" · Product updates · scheduled 2026-10-20T09:00:00Z",
            post.id
        )),
        "{}",
        list.text
    );
    let mut copy = panel(9);
    copy.restore(&env.checkpoint()).unwrap();
    assert_eq!(copy.posts(), env.posts());
    assert_eq!(copy.outcome(), env.outcome());
}

#[test]
fn saving_and_scheduling_need_approval_and_nothing_else_does() {
    let env = panel(1);
    let needs: Vec<(String, bool)> = env
        .tools()
        .iter()
        .map(|t| (t.spec().name.clone(), t.spec().needs_approval))
        .collect();
    assert_eq!(
        needs,
        vec![
            ("navigate".to_owned(), false),
            ("fill_form".to_owned(), false),
            ("save_post".to_owned(), true),
            ("schedule_post".to_owned(), true),
        ]
    );
}
