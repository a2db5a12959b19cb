// Passkeys in the console: adding one, signing in with one, and confirming a decision with
// one. The server keeps every ceremony's state; this script only carries the browser's
// WebAuthn answers to it, as JSON with base64url binary fields.
(() => {
  const enc = (buf) => btoa(String.fromCharCode(...new Uint8Array(buf)))
    .replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
  const dec = (s) => Uint8Array.from(atob(s.replace(/-/g, '+').replace(/_/g, '/')), (c) => c.charCodeAt(0));

  const creationOptions = (o) => {
    const pk = o.publicKey;
    pk.challenge = dec(pk.challenge);
    pk.user.id = dec(pk.user.id);
    (pk.excludeCredentials || []).forEach((c) => { c.id = dec(c.id); });
    return { publicKey: pk };
  };
  const requestOptions = (o) => {
    const pk = o.publicKey;
    pk.challenge = dec(pk.challenge);
    (pk.allowCredentials || []).forEach((c) => { c.id = dec(c.id); });
    return { publicKey: pk };
  };
  const credentialJson = (c) => ({
    id: c.id, rawId: enc(c.rawId), type: c.type,
    response: {
      attestationObject: enc(c.response.attestationObject),
      clientDataJSON: enc(c.response.clientDataJSON),
    },
    extensions: c.getClientExtensionResults(),
  });
  const assertionJson = (c) => ({
    id: c.id, rawId: enc(c.rawId), type: c.type,
    response: {
      authenticatorData: enc(c.response.authenticatorData),
      clientDataJSON: enc(c.response.clientDataJSON),
      signature: enc(c.response.signature),
      userHandle: c.response.userHandle ? enc(c.response.userHandle) : null,
    },
    extensions: c.getClientExtensionResults(),
  });

  const say = (form, text) => {
    let el = form.querySelector('[data-passkey-status]');
    if (!el) {
      el = document.createElement('p');
      el.setAttribute('data-passkey-status', '');
      el.setAttribute('role', 'alert');
      el.className = 'error';
      form.appendChild(el);
    }
    el.textContent = text;
  };
  const setField = (form, name, value) => {
    let input = form.querySelector(`input[name="${name}"]`);
    if (!input) {
      input = document.createElement('input');
      input.type = 'hidden';
      input.name = name;
      form.appendChild(input);
    }
    input.value = value;
  };
  // A fetch answer: the JSON, or an error carrying what the server said. A service that asks
  // for a passkey first answers `{needed: true, ceremony, options}`: returned, not thrown.
  const post = async (url, form, extra) => {
    const body = new URLSearchParams(new FormData(form));
    Object.entries(extra || {}).forEach(([k, v]) => body.set(k, v));
    const r = await fetch(url, { method: 'POST', body, credentials: 'same-origin' });
    const data = await r.json().catch(() => ({ error: `the server answered ${r.status}` }));
    if (!r.ok && !data.needed) throw new Error(data.error || `the server answered ${r.status}`);
    return data;
  };

  // Signs a decision's ceremony and puts the assertion on the form, beside its fields.
  const sign = async (form, ceremony, options) => {
    const cred = await navigator.credentials.get(requestOptions(options));
    setField(form, 'passkey_ceremony', ceremony);
    setField(form, 'passkey_assertion', JSON.stringify(assertionJson(cred)));
  };

  // Cancel on a confirmation goes back to the page the form was on.
  document.addEventListener('click', (e) => {
    const back = e.target.closest && e.target.closest('a[data-back]');
    if (back && history.length > 1) {
      e.preventDefault();
      history.back();
    }
  });

  document.addEventListener('submit', async (e) => {
    const form = e.target;
    if (form.dataset.passkeyDone) return;
    const kinds = ['passkeyConfirm', 'passkeyRegister', 'passkeySignin'];
    if (!kinds.some((k) => k in form.dataset)) return;
    e.preventDefault();
    const submitter = e.submitter;
    try {
      if ('passkeySignin' in form.dataset) {
        const answer = await post('/login/passkey/options', form);
        const cred = await navigator.credentials.get(requestOptions(answer.options));
        setField(form, 'ceremony', answer.ceremony);
        setField(form, 'assertion', JSON.stringify(assertionJson(cred)));
      } else if ('passkeyRegister' in form.dataset) {
        // A form may name its own options endpoint (joining by an invitation) and then posts
        // back to itself; adding one to one's account posts to /account/passkeys. A further
        // passkey is a decision: the server answers with its ceremony, signed with one held.
        const url = form.dataset.options || '/account/passkeys/options';
        // A retry starts afresh: a ceremony signed before is used up.
        form.querySelectorAll('input[name="passkey_ceremony"], input[name="passkey_assertion"]')
          .forEach((input) => input.remove());
        let answer = await post(url, form);
        if (answer.needed) {
          await sign(form, answer.ceremony, answer.options);
          answer = await post(url, form);
          if (answer.needed) throw new Error('the passkey check did not hold');
        }
        const cred = await navigator.credentials.create(creationOptions(answer.options));
        setField(form, 'ceremony', answer.ceremony);
        setField(form, 'credential', JSON.stringify(credentialJson(cred)));
        if (!form.dataset.options) form.action = '/account/passkeys';
      } else {
        // The confirmation the service asked for: its ceremony, made for this decision.
        await sign(form, form.dataset.ceremony, JSON.parse(form.dataset.options));
      }
      if (submitter && submitter.name) setField(form, submitter.name, submitter.value);
      form.dataset.passkeyDone = '1';
      form.submit();
    } catch (err) {
      say(form, `Not done: ${err.message || err}. Nothing changed; try again.`);
    }
  });
})();
