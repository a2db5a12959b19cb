// Drives the Gatehouse console as a tenant admin would, in Debian's Chromium.
// Usage: node console.mjs --control URL --email E --password P --dispatcher EMAIL --shots DIR
// Prints one JSON line with what it saw; exits non-zero (after a screenshot) on any failure.
import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";
import { join } from "node:path";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, v, i, all) => (i % 2 === 0 ? [...pairs, [v.replace(/^--/, ""), all[i + 1]]] : pairs), []),
);
const control = args.control;
const shots = args.shots ?? "screenshots";
mkdirSync(shots, { recursive: true });

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const page = await browser.newPage();
const out = {};
let step = "start";
function expect(condition, message) {
  if (!condition) throw new Error(`${step}: ${message}`);
}

try {
  step = "sign in";
  await page.goto(`${control}/connections`);
  expect(page.url().includes("/login"), "an anonymous visit is sent to sign in");
  await page.getByLabel("Email").fill(args.email);
  await page.getByLabel("Password").fill("wrong password");
  await page.getByRole("button", { name: "Sign in" }).click();
  expect((await page.getByRole("alert").textContent()).includes("wrong"), "a wrong password is refused");
  await page.getByLabel("Email").fill(args.email);
  await page.getByLabel("Password").fill(args.password);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.waitForURL(/\/connections$/);

  step = "create a connection";
  await page.getByRole("link", { name: "New connection" }).click();
  await page.waitForURL(/\/connections\/new$/);
  await page.getByLabel("Name").fill("Browser test agent");
  for (const box of await page.locator("input[name=right]").all()) {
    if (await box.isChecked()) await box.uncheck();
  }
  await page.locator("input[name=right][value='bookings:read']").check();
  await page.getByRole("button", { name: "Create connection" }).click();
  const token = (await page.locator("#token").textContent()).trim();
  expect(token.startsWith("gh_mcp_"), "the token is shown");
  const claude = await page.locator("#claude").textContent();
  expect(claude.includes("claude mcp add --transport http") && claude.includes(token), "a ready claude mcp add line");
  out.token = token;
  out.connection = (await page.getByRole("status").locator("code").textContent()).trim();

  step = "reloading the created page creates nothing";
  expect(page.url().endsWith(`/connections/${out.connection}/created`), "the create redirected (post/redirect/get)");
  await page.reload();
  expect(!(await page.content()).includes(token), "a reload does not show the token again");
  expect((await page.getByRole("status").first().textContent()).includes("was shown once"), "a reload says the token was shown once");

  step = "the token is shown once";
  await page.goto(`${control}/connections`);
  expect(!(await page.content()).includes(token), "the list never shows the token again");
  const row = page.locator("tr", { hasText: "Browser test agent" });
  expect((await row.textContent()).includes("read1 right(s)") || (await row.textContent()).includes("read 1 right(s)"), "the list summarizes the narrowed rights by level");

  step = "revoke it";
  await page.getByRole("link", { name: "Browser test agent" }).click();
  await page.getByRole("link", { name: /Revoke this connection/ }).click();
  await page.getByLabel("Reason").fill("browser test done");
  await page.getByRole("button", { name: "Revoke" }).click();
  expect((await page.content()).includes("status-revoked"), "the connection shows as revoked");

  step = "change a role";
  await page.goto(`${control}/people`);
  const person = page.locator("tr", { hasText: args.dispatcher });
  await person.getByRole("combobox").selectOption("viewer");
  await person.getByRole("button", { name: "Change role…" }).click();
  expect((await page.locator("main").textContent()).includes("They lose:"), "the confirmation says what the change takes");
  await page.getByRole("button", { name: "Change role to viewer" }).click();
  expect((await page.locator("#notice").textContent()).includes("is now viewer"), "the save says what it saved");
  expect((await page.locator("tr", { hasText: args.dispatcher }).textContent()).includes("viewer"), "the new role shows");

  step = "the last admin cannot demote themself";
  const me = page.locator("tr", { hasText: args.email });
  await me.getByRole("combobox").selectOption("viewer");
  await me.getByRole("button", { name: "Change role…" }).click();
  expect((await page.locator("main").textContent()).includes("This is your own role"), "the confirmation warns it is your own role");
  await page.getByRole("button", { name: "Change role to viewer" }).click();
  expect((await page.getByRole("alert").textContent()).includes("last active admin"), "the last admin is refused in words");
  out.last_admin_refused = true;

  step = "flip the tenant switch";
  await page.goto(`${control}/settings`);
  await page.getByLabel("Reason").fill("browser test");
  await page.getByRole("button", { name: "Turn agent access off" }).click();
  expect((await page.locator("#agent-access-state").textContent()).includes("OFF"), "agent access shows off");
  await page.goto(`${control}/connections`);
  expect((await page.locator(".banner-danger").textContent()).includes("Agent access is off"), "every page carries the banner");
  expect((await page.content()).includes("blocked: agent access off"), "connections show they are blocked");
  await page.goto(`${control}/settings`);
  out.switched_off = true;
  await page.getByLabel("Reason").fill("browser test over");
  await page.getByRole("button", { name: "Turn agent access on" }).click();
  expect(!(await page.locator("#agent-access-state").textContent()).includes("OFF"), "agent access shows on again");

  step = "audit";
  await page.goto(`${control}/audit?tool=connection.revoke`);
  expect((await page.locator("tbody").textContent()).includes(out.connection), "the revocation is in the audit");

  step = "messages";
  await page.goto(`${control}/messages`);
  expect((await page.locator("h1").textContent()) === "Messages", "the messages page opens");

  step = "sign out";
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.waitForURL(/\/login/);
  await page.goto(`${control}/connections`);
  expect(page.url().includes("/login"), "signed out");

  console.log(JSON.stringify(out));
  await browser.close();
} catch (error) {
  const file = join(shots, `failure-${step.replace(/\W+/g, "-")}.png`);
  await page.screenshot({ path: file, fullPage: true }).catch(() => {});
  console.error(`${error.message}\nscreenshot: ${file}\nurl: ${page.url()}`);
  await browser.close();
  process.exit(1);
}
