// Every console page a tenant admin reaches, checked with axe-core and photographed at 1400 px
// and 390 px, for review. Usage:
//   node review.mjs --control URL --email E --password P --shots DIR
// Prints one JSON line: per page, its serious and critical violations (axe's impact); exits 1
// when any page has one. Screenshots land in DIR as <page>-1400.png and <page>-390.png.
import { chromium } from "playwright-core";
import { mkdirSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, v, i, all) => (i % 2 === 0 ? [...pairs, [v.replace(/^--/, ""), all[i + 1]]] : pairs), []),
);
const control = args.control;
const shots = args.shots ?? "screenshots";
mkdirSync(shots, { recursive: true });
const axe = readFileSync(createRequire(import.meta.url).resolve("axe-core/axe.min.js"), "utf8");

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
// The console's Content-Security-Policy refuses inline script, as it should; the check's own
// script is let in for this review only.
const context = await browser.newContext({ bypassCSP: true, viewport: { width: 1400, height: 900 } });
const page = await context.newPage();

// The pages, with a stable name each. A connection's and its edit page come from the list.
const pages = [
  ["home", "/"],
  ["activity", "/activity"],
  ["connections", "/connections"],
  ["connection-new", "/connections/new"],
  ["people", "/people"],
  ["people-invite", "/people/invite"],
  ["api-tokens", "/api-tokens"],
  ["api-token-new", "/api-tokens/new"],
  ["audit", "/audit"],
  ["messages", "/messages"],
  ["approvals", "/approvals"],
  ["settings", "/settings"],
  ["settings-approvals", "/settings/approvals"],
  ["settings-limits", "/settings/limits"],
  ["settings-security", "/settings/security"],
  ["settings-sso", "/settings/sso"],
  ["audit-webhook", "/audit/webhook"],
  ["account-passkeys", "/account/passkeys"],
  ["operator", "/operator"],
];

const out = { pages: {}, failing: [] };
try {
  await page.goto(`${control}/login`);
  await check("login", false);
  await page.getByLabel("Email").fill(args.email);
  await page.getByLabel("Password").fill(args.password);
  await Promise.all([page.waitForNavigation(), page.getByRole("button", { name: "Sign in" }).click()]);
  await page.goto(`${control}/connections`);
  const first = await page.locator('tbody a[href^="/connections/con_"]').first().getAttribute("href");
  pages.push(["connection", first], ["connection-edit", `${first}/edit`], ["connection-revoke", `${first}/revoke`]);
  for (const [name, path] of pages) {
    await page.goto(`${control}${path}`);
    await check(name, true);
  }
  // An invitation: the page after sending (the link once), and the page its link opens.
  await page.goto(`${control}/people/invite`);
  await page.getByLabel("Email").fill("review.invitee@example.com");
  await page.getByLabel("Name").fill("Review Invitee");
  await Promise.all([page.waitForNavigation(), page.getByRole("button", { name: "Send the invitation" }).click()]);
  await check("invitation-sent", true);
  const link = (await page.locator("#invitation-link").textContent()).trim();
  await page.context().clearCookies();
  await page.goto(link.replace(/^https?:\/\/[^/]+/, control));
  await check("invitation-accept", false);
  console.log(JSON.stringify(out));
  await browser.close();
  process.exit(out.failing.length ? 1 : 0);
} catch (error) {
  console.error(error.stack ?? String(error));
  console.log(JSON.stringify(out));
  await browser.close();
  process.exit(2);
}

async function check(name) {
  await page.addScriptTag({ content: axe });
  const result = await page.evaluate(async () => {
    const r = await window.axe.run(document, { resultTypes: ["violations"] });
    return r.violations.map((v) => ({ id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.slice(0, 3).map((n) => n.target.join(" ")) }));
  });
  const serious = result.filter((v) => v.impact === "serious" || v.impact === "critical");
  out.pages[name] = { url: page.url(), serious, other: result.filter((v) => !serious.includes(v)).map((v) => v.id) };
  if (serious.length) out.failing.push(name);
  for (const width of [1400, 390]) {
    await page.setViewportSize({ width, height: 900 });
    await page.screenshot({ path: join(shots, `${name}-${width}.png`), fullPage: true });
  }
  await page.setViewportSize({ width: 1400, height: 900 });
}
