//! The operator's console in a real headless Chromium (Debian's `chromium`
//! and `chromium-driver`, installed by `scripts/setup --tests`), driven
//! through chromedriver with fantoccini, against a real coordinator and
//! real agents: sign-in, the fleet filling in live, a task turning
//! succeeded without a reload, its placement explanation, output escaping,
//! roles (operator revokes, viewer is refused), CSRF, and the cookie's
//! flags.
//!
//! With `UPDATE_SCREENSHOTS=1` the tests write a PNG of each page into
//! `docs/console/`.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use starling_tests::{
    binary, free_port, modules, wait_for_port, wasm_file, workspace_root, Agent, Coordinator, Store,
};

/// How long a page may take to show what a test waits for: agents enroll
/// and report, tasks are placed and run, on a loaded two-core machine.
const PATIENCE: Duration = Duration::from_secs(30);

/// A chromedriver on an ephemeral port, killed when dropped.
struct ChromeDriver {
    child: Child,
    port: u16,
}

impl ChromeDriver {
    fn start() -> Self {
        let port = free_port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| {
                panic!(
                    "cannot start chromedriver ({error}); install Debian's chromium and chromium-driver with scripts/setup --tests"
                )
            });
        wait_for_port(
            SocketAddr::from(([127, 0, 0, 1], port)),
            Duration::from_secs(20),
        );
        Self { child, port }
    }
}

impl Drop for ChromeDriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A headless Chromium session on one coordinator's console. Every call
/// blocks on the session's own runtime, so the harness's blocking helpers
/// (the CLI, agents) run between calls, never inside one.
struct Browser {
    runtime: tokio::runtime::Runtime,
    client: Option<Client>,
    base: String,
    _driver: ChromeDriver,
}

impl Browser {
    fn open(base: &str) -> Self {
        let driver = ChromeDriver::start();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": "/usr/bin/chromium",
                // Root in CI: Chromium's sandbox needs user namespaces it
                // may not have; the pages are our own.
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1400,1000"]
            }),
        );
        let client = runtime
            .block_on(
                ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                    .capabilities(capabilities)
                    .connect(&format!("http://127.0.0.1:{}", driver.port)),
            )
            .expect("chromedriver opens a Chromium session");
        Self {
            runtime,
            client: Some(client),
            base: base.to_string(),
            _driver: driver,
        }
    }

    fn client(&self) -> &Client {
        self.client.as_ref().unwrap()
    }

    fn goto(&self, path: &str) {
        let url = format!("{}{path}", self.base);
        self.runtime.block_on(self.client().goto(&url)).unwrap();
    }

    fn path(&self) -> String {
        let url = self.runtime.block_on(self.client().current_url()).unwrap();
        match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_string(),
        }
    }

    /// Waits for an element matching `css`; panics with the page on timeout.
    fn wait_for(&self, css: &str) {
        let found = self.runtime.block_on(
            self.client()
                .wait()
                .at_most(PATIENCE)
                .every(Duration::from_millis(100))
                .for_element(Locator::Css(css)),
        );
        if found.is_err() {
            panic!(
                "no {css} on {} after {PATIENCE:?}; the page:\n{}",
                self.path(),
                self.source()
            );
        }
    }

    fn exists(&self, css: &str) -> bool {
        self.runtime
            .block_on(self.client().find(Locator::Css(css)))
            .is_ok()
    }

    fn text(&self, css: &str) -> String {
        self.runtime.block_on(async {
            self.client()
                .find(Locator::Css(css))
                .await
                .unwrap_or_else(|_| panic!("no {css}"))
                .text()
                .await
                .unwrap()
        })
    }

    fn click(&self, css: &str) {
        self.runtime.block_on(async {
            self.client()
                .find(Locator::Css(css))
                .await
                .unwrap_or_else(|_| panic!("no {css}"))
                .click()
                .await
                .unwrap()
        });
    }

    fn source(&self) -> String {
        self.runtime.block_on(self.client().source()).unwrap()
    }

    fn eval(&self, script: &str, args: Vec<Value>) -> Value {
        self.runtime
            .block_on(self.client().execute(script, args))
            .unwrap()
    }

    /// Marks the loaded page; [`Browser::still_marked`] says whether the
    /// same page is still there (no reload, no navigation).
    fn mark(&self) {
        self.eval("window.__kept = 'same page'; return null;", vec![]);
    }

    fn still_marked(&self) -> bool {
        self.eval("return window.__kept === 'same page';", vec![]) == json!(true)
    }

    fn sign_in(&self, token: &str) {
        self.goto("/login");
        self.runtime.block_on(async {
            let form = self
                .client()
                .form(Locator::Css("form[action='/login']"))
                .await
                .unwrap();
            form.set_by_name("token", token).await.unwrap();
            form.submit().await.unwrap();
        });
    }

    /// The session cookie: (value, HttpOnly, SameSite).
    fn session_cookie(&self) -> Option<(String, Option<bool>, String)> {
        self.runtime
            .block_on(self.client().get_named_cookie("starling_session"))
            .ok()
            .map(|cookie| {
                (
                    cookie.value().to_string(),
                    cookie.http_only(),
                    format!("{:?}", cookie.same_site()),
                )
            })
    }

    /// Submits a form built in the page: POST `action` with `fields`
    /// (what a forged or tampered form would send from the console's own
    /// origin).
    fn post_form(&self, action: &str, fields: &[(&str, &str)]) {
        let fields: Vec<Value> = fields.iter().map(|(k, v)| json!([k, v])).collect();
        self.eval(
            "const form = document.createElement('form');
             form.method = 'post'; form.action = arguments[0];
             for (const [name, value] of arguments[1]) {
               const input = document.createElement('input');
               input.type = 'hidden'; input.name = name; input.value = value;
               form.appendChild(input);
             }
             document.body.appendChild(form); form.submit(); return null;",
            vec![json!(action), json!(fields)],
        );
        // The answer replaces the page; wait for the new document.
        std::thread::sleep(Duration::from_millis(300));
        self.wait_for("main");
    }

    /// This page's CSRF token (every signed-in page has the sign-out form).
    fn csrf(&self) -> String {
        self.eval(
            "return document.querySelector('input[name=csrf]').value;",
            vec![],
        )
        .as_str()
        .unwrap()
        .to_string()
    }

    /// With `UPDATE_SCREENSHOTS=1`: the page `path` as
    /// `docs/console/NAME.png`, loaded afresh and given a few seconds for
    /// its sparklines to fill (only then: the tests themselves never wait
    /// for that).
    fn screenshot_of(&self, path: &str, name: &str) {
        if !screenshots() {
            return;
        }
        self.goto(path);
        // Going to the URL already open does not load it again.
        self.runtime.block_on(self.client().refresh()).unwrap();
        std::thread::sleep(Duration::from_secs(6));
        self.screenshot(name);
    }

    /// With `UPDATE_SCREENSHOTS=1`: the page as `docs/console/NAME.png`.
    fn screenshot(&self, name: &str) {
        if !screenshots() {
            return;
        }
        let png = self.runtime.block_on(self.client().screenshot()).unwrap();
        let dir = workspace_root().join("docs/console");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            let _ = self.runtime.block_on(async {
                tokio::time::timeout(Duration::from_secs(5), client.close()).await
            });
        }
    }
}

/// Whether this run writes the screenshots (`UPDATE_SCREENSHOTS=1`).
fn screenshots() -> bool {
    std::env::var("UPDATE_SCREENSHOTS").as_deref() == Ok("1")
}

/// Whether the coordinator still lists `node` as online (not revoked).
fn online(coordinator: &Coordinator, node: &str) -> bool {
    let (status, text) = coordinator.http("GET", &format!("/api/v1/nodes/{node}"), None);
    assert_eq!(status, 200, "{text}");
    serde_json::from_str::<Value>(&text).unwrap()["online"] == json!(true)
}

fn api_token(coordinator: &Coordinator, role: &str) -> String {
    let created = coordinator.cli_json(
        &["api-token", "create", "--role", role, "--name", role],
        None,
    );
    created["token"].as_str().unwrap().to_string()
}

#[test]
fn the_console_fills_in_live_and_explains_a_placement() {
    let _turn = crate::alongside();
    // A site of its own federation, so the sites page has a member.
    let key = String::from_utf8(
        Command::new(binary("starling-coordinator"))
            .arg("cluster-key")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let root = tempfile::tempdir().unwrap();
    let credentials = starling_tests::site_credentials(root.path(), &["lab"]);
    let coordinator = Coordinator::start(
        None,
        Store::Sqlite,
        &[
            "--site",
            "lab",
            "--site-credentials",
            credentials[0].to_str().unwrap(),
            "--cluster-key",
            key.trim(),
            "--gossip-listen",
            "127.0.0.1:0",
        ],
    );
    let browser = Browser::open(&coordinator.rest);

    // Signed out, every page leads to the sign-in form.
    browser.goto("/tasks");
    browser.wait_for("#token");
    assert_eq!(browser.path(), "/login?next=%2Ftasks");
    browser.screenshot("login");
    browser.sign_in("not-a-token");
    browser.wait_for("#problem");
    assert!(browser.session_cookie().is_none());

    browser.sign_in(&coordinator.token);
    browser.wait_for("table#fleet");
    assert_eq!(browser.path(), "/");
    let (session, http_only, same_site) = browser.session_cookie().expect("a session cookie");
    assert_eq!(http_only, Some(true), "the session cookie is HttpOnly");
    assert_eq!(
        same_site, "Some(Strict)",
        "the session cookie is SameSite=Strict"
    );
    assert_eq!(session.len(), 64, "the cookie holds a 256-bit session id");
    assert!(
        !session.contains(&coordinator.token),
        "the API token is not in the cookie"
    );
    assert!(
        browser.eval("return document.cookie;", vec![]) == json!(""),
        "scripts cannot read the session cookie"
    );

    // Agents start while the fleet page is open: their rows appear, and
    // their sparklines draw, without a reload.
    browser.mark();
    let _a = Agent::start(&coordinator, &coordinator.mqtt, "console-a", "zone=lab");
    let _b = Agent::start(&coordinator, &coordinator.mqtt, "console-b", "zone=field");
    browser.wait_for("tr[data-node='console-a'] [data-state='online']");
    browser.wait_for("tr[data-node='console-b'] [data-state='online']");
    browser.wait_for("tr[data-node='console-a'] svg.spark polyline");
    assert_eq!(browser.text("#fleet-summary"), "2 nodes, 2 online");
    assert!(
        browser.still_marked(),
        "the fleet filled in without a reload"
    );
    browser.screenshot_of("/", "fleet");

    // A task submitted through the CLI turns succeeded on the open list.
    let dir = tempfile::tempdir().unwrap();
    let echo = wasm_file(dir.path(), "echo", modules::ECHO);
    let out = coordinator.cli(&["publish", echo.to_str().unwrap()], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let digest = String::from_utf8_lossy(&out.stdout).trim().to_string();
    browser.goto("/tasks");
    browser.wait_for("table#tasks");
    browser.mark();
    let hostile = "<script>window.__owned = 1</script><b>bold</b>";
    let task = coordinator
        .submit(&digest, hostile)
        .expect("the task is accepted");
    browser.wait_for(&format!("tr[data-task='{task}'] [data-state='succeeded']"));
    assert!(
        browser.still_marked(),
        "the row turned succeeded without a reload"
    );
    browser.screenshot_of("/tasks", "tasks");

    // Its page: the output escaped, and the placement explained.
    browser.goto(&format!("/tasks/{task}"));
    browser.wait_for("#output");
    assert_eq!(browser.text("#output"), format!("echo:{hostile}"));
    assert_eq!(
        browser.eval(
            "return [window.__owned === undefined, document.querySelectorAll('main script, main b').length];",
            vec![]
        ),
        json!([true, 0]),
        "the output is text, never markup"
    );
    assert!(browser.text("#explanation").contains("Why it won"));
    browser.wait_for("#explanation tr.chosen");
    let chosen = browser.text("#explanation tr.chosen");
    assert!(
        chosen.contains("console-a") || chosen.contains("console-b"),
        "{chosen}"
    );
    browser.screenshot("task");

    browser.goto("/nodes/console-a");
    browser.wait_for("#node-live figure.plot");
    assert!(browser.text("h1").contains("console-a"));
    browser.screenshot_of("/nodes/console-a", "node");

    browser.goto("/artifacts");
    browser.wait_for(&format!("tr[id='a-{digest}']"));
    browser.screenshot("artifacts");
    browser.goto("/sites");
    browser.wait_for("table#sites");
    assert!(browser.text("table#sites").contains("lab"));
    browser.screenshot_of("/sites", "sites");

    // A join token made in the console is shown once, never again.
    browser.goto("/access");
    browser.wait_for("form[action='/access/join-tokens']");
    browser.click("form[action='/access/join-tokens'] button");
    browser.wait_for("#new-secret code");
    let secret = browser.text("#new-secret code");
    assert!(!secret.is_empty());
    browser.screenshot("access");
    browser.goto("/access");
    browser.wait_for("table#api-tokens");
    assert!(!browser.exists("#new-secret"));
    assert!(!browser.source().contains(&secret));
}

#[test]
fn the_console_checks_roles_and_refuses_forged_forms() {
    let _turn = crate::alongside();
    let coordinator = Coordinator::start(None, Store::Sqlite, &[]);
    let _agent = Agent::start(&coordinator, &coordinator.mqtt, "console-r", "");
    coordinator.wait_for_nodes(1, PATIENCE);
    let viewer = api_token(&coordinator, "viewer");
    let operator = api_token(&coordinator, "operator");
    let browser = Browser::open(&coordinator.rest);
    let revoke = "/nodes/console-r/revoke";

    // A viewer sees the node but no revoke button, and a form posted anyway
    // (with the session's own CSRF token) is refused: 403, node unchanged.
    browser.sign_in(&viewer);
    browser.wait_for("table#fleet");
    browser.goto("/nodes/console-r");
    browser.wait_for("#node-live");
    assert!(!browser.exists("#revoke"));
    let csrf = browser.csrf();
    browser.post_form(revoke, &[("csrf", &csrf)]);
    assert!(browser.text("h1").contains("403"), "{}", browser.source());
    assert!(browser.text("main").contains("needs the operator role"));
    assert!(online(&coordinator, "console-r"));
    browser.goto("/access");
    browser.wait_for("main h1");
    assert!(browser.text("h1").contains("403"));

    // Signing out ends the session.
    browser.goto("/");
    browser.wait_for("table#fleet");
    browser.click("form[action='/logout'] button");
    browser.wait_for("#token");
    browser.goto("/");
    browser.wait_for("#token");

    // An operator's forms without the CSRF token, or with a wrong one, are
    // refused and change nothing.
    browser.sign_in(&operator);
    browser.wait_for("table#fleet");
    browser.goto("/nodes/console-r");
    browser.wait_for("#revoke");
    browser.post_form(revoke, &[]);
    assert!(browser.text("h1").contains("403"));
    assert!(browser.text("main").contains("CSRF"));
    browser.goto("/nodes/console-r");
    browser.wait_for("#revoke");
    browser.post_form(revoke, &[("csrf", "0".repeat(64).as_str())]);
    assert!(browser.text("h1").contains("403"));
    assert!(online(&coordinator, "console-r"));

    // The right token from another origin is refused too.
    browser.goto("/nodes/console-r");
    browser.wait_for("#revoke");
    let csrf = browser.csrf();
    let (session, _, _) = browser.session_cookie().unwrap();
    let status = browser.runtime.block_on(async {
        reqwest::Client::new()
            .post(format!("{}{revoke}", coordinator.rest))
            .header("cookie", format!("starling_session={session}"))
            .header("origin", "http://evil.example")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("csrf={csrf}"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    });
    assert_eq!(status, 403);
    assert!(online(&coordinator, "console-r"));

    // The session cookie stands in for a bearer token on the API's GET
    // routes (a browser's EventSource reads GET /api/v1/events with it),
    // and on nothing else.
    let (events, nodes, revoke_api) = browser.runtime.block_on(async {
        let client = reqwest::Client::new();
        let cookie = format!("starling_session={session}");
        let events = client
            .get(format!("{}/api/v1/events?kind=node", coordinator.rest))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap();
        let events = (
            events.status().as_u16(),
            events
                .headers()
                .get("content-type")
                .map(|v| v.to_str().unwrap().to_string()),
        );
        let nodes = client
            .get(format!("{}/api/v1/nodes", coordinator.rest))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        let revoke_api = client
            .post(format!(
                "{}/api/v1/nodes/console-r/revoke",
                coordinator.rest
            ))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        (events, nodes, revoke_api)
    });
    assert_eq!(events.0, 200);
    assert!(events
        .1
        .unwrap_or_default()
        .starts_with("text/event-stream"));
    assert_eq!(nodes, 200);
    assert_eq!(
        revoke_api, 401,
        "a cookie alone never makes a POST to the API"
    );
    assert!(online(&coordinator, "console-r"));

    // The operator's own button revokes it.
    browser.click("#revoke");
    browser.wait_for("h1 .badge.revoked");
    assert!(!online(&coordinator, "console-r"));

    // Revoking the operator's token ends its session at the next request.
    let tokens = coordinator.cli_json(&["api-token", "list"], None);
    let id = tokens
        .as_array()
        .or_else(|| tokens["tokens"].as_array())
        .unwrap()
        .iter()
        .find(|token| token["role"] == "operator")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let out = coordinator.cli(&["api-token", "revoke", &id], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    browser.goto("/");
    browser.wait_for("#token");
}
