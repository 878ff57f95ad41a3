//! End-to-end, loopback only: radix-serve instances behind SGLang's router (`sglang-router`,
//! pinned with hashes in tests/python/router-requirements.txt, installed by scripts/router-env.sh
//! into ~/.cache/radix-serve/routerenv).
//!
//! - `worker_endpoints_answer_what_routers_read`: `/server_info`, `/model_info`, `/get_load`,
//!   `/flush_cache` and the routing-key headers on one instance (no router needed; ~5 s).
//! - `router_registers_routes_and_survives_a_kill` (CI smoke, ~30 s): two instances behind a
//!   `cache_aware` router; registration reads our endpoints, a request is routed, and once one
//!   instance is killed every request ends within [`fleet::REQUEST_BOUND`] and the other serves;
//!   the survivor's cache page data lists a routed request under its routing key.
//! - `three_instances_behind_sglang_router` (ignored: 3 to 8 minutes on 2 busy cores; run by
//!   `benches/run-router-bench.sh`, results in benches/README.md): three SmolLM2 instances; the same
//!   interleaved agent sessions (4 sessions sharing a system prompt, 5 requests each) are replayed
//!   on one instance alone, then through the router with `cache_aware`, `round_robin` and `manual`
//!   (keyed by `x-smg-routing-key`); the aggregate hit ratio (sum of `cached_tokens` over sum of
//!   `prompt_tokens`), the requests per instance and the errors are printed for each. `cache_aware`
//!   must stay within 2 points of the single instance, and `manual` must keep each session on one
//!   instance. Then, through a `cache_aware` router, the busiest instance is killed mid-replay:
//!   every request must end within [`fleet::REQUEST_BOUND`] (an answer or an error, never a hang),
//!   and the surviving instances must serve the rest.
//!
//! The router tests skip, saying so, only when the router cannot be installed.

mod common;
#[path = "router/fleet.rs"]
mod fleet;

use std::time::Duration;

use common::Server;
use fleet::{REQUEST_BOUND, Replay, Router, SESSIONS, flush, interleaved_sessions, replay, router_launcher};
use serde_json::{Value as Json, json};

/// A request with headers; the status, the headers asked for and the body.
fn post_with(base: &str, path: &str, headers: &[(&str, &str)], body: &Json) -> (u16, Option<String>, Json) {
    let mut request = ureq::post(&format!("{base}{path}")).timeout(Duration::from_secs(120));
    for (name, value) in headers {
        request = request.set(name, value);
    }
    match request.send_json(body) {
        Ok(r) => (r.status(), r.header("x-session-affinity").map(str::to_owned), r.into_json().unwrap_or(Json::Null)),
        Err(ureq::Error::Status(code, r)) => (code, None, r.into_json().unwrap_or(Json::Null)),
        Err(e) => panic!("POST {path}: {e}"),
    }
}

#[test]
fn worker_endpoints_answer_what_routers_read() {
    let server = Server::start(&["-np", "3"]);
    let info = server.get("/server_info");
    let model_file = common::asset("smollm2");
    assert_eq!(info["model_path"], model_file.display().to_string(), "{info}");
    assert_eq!(info["served_model_name"], model_file.file_name().unwrap().to_str().unwrap());
    assert_eq!(info["max_running_requests"], 3);
    assert_eq!(info["dp_size"], 1);
    assert_eq!(info["prefix_cache"], true);
    let page_size = info["page_size"].as_u64().unwrap();
    assert!(info["max_total_tokens"].as_u64().unwrap() >= info["context_length"].as_u64().unwrap());
    assert!(info["version"].as_str().unwrap().starts_with("radix-serve "));
    assert_eq!(server.get("/get_server_info"), server.get("/server_info"), "the old name answers the same");
    let model = server.get("/model_info");
    assert_eq!(model["model_type"], "llama", "{model}");
    assert_eq!(model["is_generation"], true);
    assert_eq!(model["hybrid"], false);
    assert_eq!(server.get("/get_model_info"), model);

    let idle = server.get("/get_load");
    assert_eq!(idle.as_array().map(Vec::len), Some(1), "{idle}");
    assert_eq!(idle[0]["num_reqs"], 0);
    assert_eq!(idle[0]["num_waiting_reqs"], 0);
    assert_eq!(idle[0]["num_cached_tokens"], 0);

    // A keyed request: the key comes back, by either header.
    let body = common::chat(json!([{"role": "user", "content": common::filler(3, 60)}]), 4);
    let (status, echoed, answer) =
        post_with(&server.base, "/v1/chat/completions", &[("x-smg-routing-key", "s-1")], &body);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(echoed.as_deref(), Some("s-1"));
    let (status, echoed, _) =
        post_with(&server.base, "/v1/chat/completions", &[("x-session-affinity", "agent-7")], &body);
    assert_eq!((status, echoed.as_deref()), (200, Some("agent-7")));
    // The log line comes through the server's stderr, read by another thread: wait for it.
    let logged = |l: &String| l.starts_with("radix-serve: session agent-7: POST /v1/chat/completions -> 200 (cached=");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !server.log().iter().any(logged) {
        assert!(std::time::Instant::now() < deadline, "no session log line");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A bad key is a 400 naming the header, on the Anthropic route in Anthropic's shape.
    let long = "k".repeat(300);
    let (status, _, error) = post_with(&server.base, "/v1/chat/completions", &[("x-session-affinity", &long)], &body);
    assert_eq!(status, 400);
    assert!(error["error"]["message"].as_str().unwrap().contains("x-session-affinity"), "{error}");
    let messages = json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]});
    let (status, _, error) = post_with(&server.base, "/v1/messages", &[("x-smg-routing-key", &long)], &messages);
    assert_eq!((status, error["type"].as_str()), (400, Some("error")), "{error}");

    // The cache now holds the prompt; the load says so, and a flush empties it. A reply is sent
    // before its sequence leaves the engine, so wait for that: the flush is then immediate.
    server.wait_idle();
    let load = server.get("/get_load");
    let cached = load[0]["num_cached_tokens"].as_u64().unwrap();
    assert!(cached > 0 && cached.is_multiple_of(page_size), "{load}");
    let flushed = ureq::post(&format!("{}/flush_cache", server.base)).call().unwrap().into_json::<Json>().unwrap();
    assert_eq!(flushed["cached_tokens"], cached, "{flushed}");
    assert_eq!(flushed["status"], "flushed");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while server.get("/get_load")[0]["num_cached_tokens"] != 0 {
        assert!(std::time::Instant::now() < deadline, "the flush never happened");
        std::thread::sleep(Duration::from_millis(50));
    }
    let metrics = server.get_text("/metrics");
    for name in ["radix_serve_kv_usage_ratio ", "radix_serve_sequences_max 3", "radix_serve_sequences_waiting 0"] {
        assert!(metrics.lines().any(|l| l.starts_with(name)), "{name} missing from /metrics");
    }
    server.wait_idle();
}

/// Prints one line per replay, as the report.
fn report(replays: &[&Replay], instances: usize) {
    println!("\n== router test: {SESSIONS} interleaved sessions, {} requests each replay", replays[0].outcomes.len());
    for r in replays {
        println!("{}", r.summary(instances));
    }
}

/// The router's launcher, or `None` after printing why the test is skipped.
fn launcher_or_skip(test: &str) -> Option<String> {
    match router_launcher() {
        Ok(launcher) => Some(launcher),
        Err(why) => {
            println!("SKIPPED {test}: the router cannot be installed: {why}");
            None
        }
    }
}

#[test]
fn router_registers_routes_and_survives_a_kill() {
    let Some(launcher) = launcher_or_skip("router_registers_routes_and_survives_a_kill") else { return };
    let mut fleet: Vec<Option<Server>> = (0..2).map(|_| Some(Server::start(&[]))).collect();
    let urls: Vec<String> = fleet.iter().flatten().map(|s| s.base.clone()).collect();
    let model_name = common::asset("smollm2").file_name().unwrap().to_str().unwrap().to_owned();
    let router = Router::start(&launcher, &urls, "cache_aware");
    for worker in router.workers()["workers"].as_array().unwrap() {
        assert_eq!(worker["model_id"], model_name, "{worker}");
        assert!(worker["metadata"]["model_path"].as_str().unwrap().ends_with(&model_name), "{worker}");
    }
    // One session's first three requests, routed: answered, with our usage, on one instance.
    let requests: Vec<(usize, Json)> = interleaved_sessions().into_iter().filter(|(s, _)| *s == 0).take(3).collect();
    let routed = replay("cache_aware, 2 instances", &router.base, &mut fleet, &requests, false, Some(1));
    println!("{}", routed.summary(2));
    let (dead, after) = routed.killed.unwrap();
    let first = &routed.outcomes[0];
    assert_eq!(first.status, Some(200), "{first:?}");
    assert!(first.prompt_tokens > 0 && first.instance == Some(dead), "{first:?}");
    // After the kill of the instance holding the session: an answer or an error, never a hang,
    // and the other instance serves once the router knows.
    for o in &routed.outcomes[after..] {
        assert!(o.elapsed < REQUEST_BOUND, "{o:?}");
        assert!(o.status.is_some(), "a failure without a status: {o:?}");
    }
    let last = routed.outcomes.last().unwrap();
    assert_eq!((last.status, last.instance), (Some(200), Some(1 - dead)), "{last:?}");
    cache_page_behind_the_router(&router, fleet[1 - dead].as_ref().expect("the survivor runs"));
}

/// The cache page behind the router: the router forwards the API only (its `/` is a 404), so
/// each worker's page is opened at the worker; there a routed request shows with the routing key
/// the router forwarded as its session.
fn cache_page_behind_the_router(router: &Router, worker: &Server) {
    let page = ureq::get(&format!("{}/", router.base)).timeout(Duration::from_secs(10)).call();
    assert!(matches!(page, Err(ureq::Error::Status(404, _))), "the router serves no page: {page:?}");
    let body = common::chat(json!([{"role": "user", "content": common::filler(5, 30)}]), 2);
    let (status, _, answer) = post_with(&router.base, "/v1/chat/completions", &[("x-smg-routing-key", "ui-1")], &body);
    assert_eq!(status, 200, "{answer}");
    let shown = worker.get("/v1/cache/requests?limit=1");
    let entry = &shown["requests"][0];
    assert_eq!(entry["session"], "ui-1", "{shown}");
    assert_eq!(entry["prompt_tokens"], answer["usage"]["prompt_tokens"], "{shown}");
    assert!(ureq::get(&format!("{}/", worker.base)).call().is_ok(), "the worker serves its page");
}

#[test]
#[ignore = "3 to 8 minutes on 2 busy cores: run by benches/run-router-bench.sh"]
fn three_instances_behind_sglang_router() {
    let Some(launcher) = launcher_or_skip("three_instances_behind_sglang_router") else { return };
    let mut fleet: Vec<Option<Server>> = (0..3).map(|_| Some(Server::start(&[]))).collect();
    let urls: Vec<String> = fleet.iter().flatten().map(|s| s.base.clone()).collect();
    let requests = interleaved_sessions();
    let model_name = common::asset("smollm2").file_name().unwrap().to_str().unwrap().to_owned();

    // One instance alone, talked to directly: the reference.
    let single_base = urls[0].clone();
    let single = replay("single instance (no router)", &single_base, &mut fleet, &requests, false, None);

    flush(&fleet);
    let router = Router::start(&launcher, &urls, "cache_aware");
    // Registration read our endpoints: the model id is the served name, the labels our metadata.
    let workers = router.workers();
    for worker in workers["workers"].as_array().unwrap() {
        assert_eq!(worker["model_id"], model_name, "{worker}");
        assert_eq!(worker["metadata"]["served_model_name"], model_name, "{worker}");
        assert!(worker["metadata"]["model_path"].as_str().unwrap().ends_with(&model_name), "{worker}");
    }
    let cache_aware = replay("sglang-router --policy cache_aware", &router.base, &mut fleet, &requests, false, None);
    drop(router);

    flush(&fleet);
    let router = Router::start(&launcher, &urls, "round_robin");
    let round_robin = replay("sglang-router --policy round_robin", &router.base, &mut fleet, &requests, false, None);
    drop(router);

    flush(&fleet);
    let router = Router::start(&launcher, &urls, "manual");
    let manual = replay("sglang-router --policy manual (keyed)", &router.base, &mut fleet, &requests, true, None);
    drop(router);

    flush(&fleet);
    let router = Router::start(&launcher, &urls, "cache_aware");
    let kill_after = requests.len() / 2;
    let failover =
        replay("cache_aware, busiest instance killed", &router.base, &mut fleet, &requests, false, Some(kill_after));
    let survivors_after = router.workers();
    drop(router);

    report(&[&single, &cache_aware, &round_robin, &manual, &failover], 3);

    for r in [&single, &cache_aware, &round_robin, &manual] {
        assert!(r.errors().is_empty(), "{}: errors without any failure: {:?}", r.name, r.errors());
    }
    let gap = (cache_aware.hit_ratio() - single.hit_ratio()).abs();
    assert!(
        gap <= 0.02,
        "cache_aware's hit ratio {:.3} is {:.1} points from a single instance's {:.3}",
        cache_aware.hit_ratio(),
        100.0 * gap,
        single.hit_ratio()
    );
    // The routing key pinned every session to one instance, and came back on every answer.
    for session in 0..SESSIONS {
        let served: Vec<Option<usize>> =
            manual.outcomes.iter().filter(|o| o.session == session).map(|o| o.instance).collect();
        assert!(served.iter().all(|i| i.is_some() && *i == served[0]), "session {session} moved: {served:?}");
    }
    let key_echoed =
        manual.outcomes.iter().all(|o| o.echoed_key.as_deref() == Some(&*format!("session-{}", o.session)));
    assert!(key_echoed, "the routing key came back on every answer");

    // The kill: nothing hung, and the survivors served the rest.
    let (dead, after) = failover.killed.expect("an instance was killed");
    for o in &failover.outcomes {
        assert!(o.elapsed < REQUEST_BOUND, "a request took {:.1}s after the kill: {o:?}", o.elapsed.as_secs_f64());
    }
    let post_kill = &failover.outcomes[after..];
    assert!(post_kill.iter().all(|o| o.instance != Some(dead)));
    // The router notices within its health checks (1 s interval, 2 failures); allow the first few
    // requests after the kill to fail, clearly (a status), and ask the rest to succeed.
    let settled = &post_kill[post_kill.len().min(4)..];
    assert!(!settled.is_empty());
    for o in settled {
        assert_eq!(o.status, Some(200), "a request once the router knew the instance was dead: {o:?}");
    }
    for o in post_kill.iter().filter(|o| o.status != Some(200)) {
        assert!(o.status.is_some(), "a failure after the kill came without a status: {o:?}");
    }
    let healthy = survivors_after["workers"].as_array().unwrap().iter().filter(|w| w["is_healthy"] == true).count();
    println!("router's view after the kill: {healthy} healthy worker(s) of {}", urls.len());
    for server in fleet.iter().flatten() {
        server.wait_idle();
    }
}
