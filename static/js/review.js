// Review workbench: keyboard shortcuts, the edit diff, and drafts that survive a reload.
// No inline script anywhere: the page passes what it needs in data- attributes.
//
// What this script needs from templates/review/item.html (change both together):
//   #review[data-draft-key][data-decided]   the page; data-decided once the server has it
//   #decision-form                          the decision form (absent: nothing to decide);
//     polls swap it while candidates arrive, keeping [hx-preserve] parts (finished
//     candidates, #verdict, #shown-at) as they are
//   article.candidate.done#candidate-<L>    a finished candidate, L its label (1, 2, …); one
//                                           still coming is #waiting-candidate-<L>
//   input[name=choice]#choice-<L>           picking it
//   details.editor[data-choice=<radio id>]  its editor, holding
//     textarea[data-original] and .diff     the edit and its word diff
//   #comment, input[name=reason_tags]       the comment and reasons
//   #corrections, [name=triage_category|priority|reply]  triage fields, filled on a pick from
//     the candidate's .triage-fields or .triage-prefill [data-category|priority|reply]
//   #triage-category-search                 narrows #triage-category as one types
//   #skip-form, #undo-form                  what "s" and "u" submit
//   #undo-form[data-undo-until]             the undo window's end (epoch ms), counted down
//   form[data-confirm]                      asks this before submitting
//   details[data-remember=<key>]            open or closed as last left (localStorage)
//   #keymap, #keymap-open                   the shortcut list and its button
(function () {
  "use strict";

  const root = document.getElementById("review");
  if (!root) return;
  const draftKey = root.dataset.draftKey;
  // The draft is dropped once the server has the decision, not on submit: a refused decision
  // (someone else was quicker, the claim lapsed) must not cost the reviewer what they typed.
  if (root.dataset.decided !== undefined) {
    try { localStorage.removeItem(draftKey); } catch (e) { /* storage off */ }
  }

  function form() { return document.getElementById("decision-form"); }
  // Keys typed into a form control are the control's (a select's type-ahead, a reply, a
  // comment), never shortcuts. A radio or checkbox takes no text: shortcuts work there.
  const NOT_TEXT_INPUTS = ["radio", "checkbox", "button", "submit", "reset"];
  function typing(target) {
    if (!target || !target.tagName) return false;
    if (target.isContentEditable || target.tagName === "TEXTAREA" || target.tagName === "SELECT") return true;
    return target.tagName === "INPUT" && NOT_TEXT_INPUTS.indexOf(target.type) === -1;
  }

  // --- Word diff between a candidate and its edit ----------------------------------------------
  // jsdiff (vendored) runs Myers' O(ND) diff, so a small edit of a long answer costs little;
  // a diff that would take longer than DIFF_TIMEOUT_MS is given up, and the box says so.
  // It runs once the reviewer pauses typing, not on every keystroke.
  const DIFF_TIMEOUT_MS = 50, DIFF_PAUSE_MS = 150;
  function renderDiff(textarea) {
    const box = textarea.parentElement.querySelector(".diff");
    if (!box) return;
    box.replaceChildren();
    const parts = Diff.diffWordsWithSpace(textarea.dataset.original || "", textarea.value, { timeout: DIFF_TIMEOUT_MS });
    if (parts === undefined) {
      box.textContent = "Too many changes to show word by word.";
      return;
    }
    if (parts.every(function (p) { return !p.added && !p.removed; })) {
      box.textContent = "No changes yet.";
      return;
    }
    parts.forEach(function (part) {
      const tag = part.added ? "ins" : part.removed ? "del" : "";
      const node = tag ? document.createElement(tag) : document.createTextNode(part.value);
      if (tag) node.textContent = part.value;
      box.appendChild(node);
    });
  }
  function debounced(run, pauseMs) {
    let timer = null;
    return function () { clearTimeout(timer); timer = setTimeout(run, pauseMs); };
  }

  // --- Drafts: what was picked, edited, ticked and written, kept in localStorage ----------------
  function saveDraft() {
    const f = form();
    if (!f || !draftKey) return;
    const draft = { choice: null, edits: {}, tags: [], comment: "", triage: {} };
    f.querySelectorAll("[name^=triage_]").forEach(function (input) { draft.triage[input.name] = input.value; });
    const picked = f.querySelector("input[name=choice]:checked");
    if (picked) draft.choice = picked.value;
    f.querySelectorAll("textarea[data-original]").forEach(function (t) {
      if (t.value !== t.dataset.original) draft.edits[t.name] = t.value;
    });
    f.querySelectorAll("input[name=reason_tags]:checked").forEach(function (c) { draft.tags.push(c.value); });
    const comment = f.querySelector("#comment");
    if (comment) draft.comment = comment.value;
    try { localStorage.setItem(draftKey, JSON.stringify(draft)); } catch (e) { /* storage full or off */ }
  }
  function restoreDraft() {
    const f = form();
    if (!f || !draftKey) return;
    let draft;
    try { draft = JSON.parse(localStorage.getItem(draftKey) || "null"); } catch (e) { draft = null; }
    if (!draft) return;
    if (draft.choice) {
      const radio = f.querySelector("input[name=choice][value='" + CSS.escape(draft.choice) + "']");
      if (radio) radio.checked = true;
    }
    Object.keys(draft.edits || {}).forEach(function (name) {
      const t = f.querySelector("textarea[name='" + CSS.escape(name) + "']");
      if (t) { t.value = draft.edits[name]; t.closest("details").open = true; renderDiff(t); }
    });
    (draft.tags || []).forEach(function (tag) {
      const c = f.querySelector("input[name=reason_tags][value='" + CSS.escape(tag) + "']");
      if (c) c.checked = true;
    });
    const comment = f.querySelector("#comment");
    if (comment && draft.comment) comment.value = draft.comment;
    Object.keys(draft.triage || {}).forEach(function (name) {
      const input = f.querySelector("[name='" + CSS.escape(name) + "']");
      if (input) input.value = draft.triage[name];
    });
  }

  // --- Wiring -----------------------------------------------------------------------------------
  // Binds `setUpOne` to each element matching `selector` under `root` once: a poll's swap
  // brings new elements (a candidate that just arrived) beside preserved ones (hx-preserve)
  // that are bound already and keep their state.
  function bindOnce(root, selector, setUpOne) {
    root.querySelectorAll(selector + ":not([data-ready])").forEach(function (element) {
      element.dataset.ready = "1";
      setUpOne(element);
    });
  }

  // Runs on load and after every poll's swap.
  function setUp() {
    const f = form();
    if (!f) return;
    bindOnce(f, "textarea[data-original]", function (t) {
      const renderSoon = debounced(function () { renderDiff(t); }, DIFF_PAUSE_MS);
      t.addEventListener("input", function () {
        const radio = document.getElementById(t.closest("details").dataset.choice);
        if (radio) radio.checked = true;
        renderSoon();
      });
    });
    bindOnce(f, "details.editor", function (d) {
      d.addEventListener("toggle", function () {
        if (d.open) { const t = d.querySelector("textarea"); renderDiff(t); }
      });
    });
    bindOnce(f, "input[name=choice]", function (radio) {
      radio.addEventListener("change", function () { prefillTriage(radio); });
    });
    bindOnce(f, "article.candidate .candidate-text", foldIfLong);
    bindOnce(document, "#decision-form", function () {
      f.addEventListener("input", saveDraft);
      f.addEventListener("change", saveDraft);
      restoreDraft();
    });
  }

  // A long answer shows its first lines, with "Show all" to unfold it.
  function foldIfLong(text) {
    text.classList.add("folded");
    if (text.scrollHeight <= text.clientHeight + 8) { text.classList.remove("folded"); return; }
    const button = document.createElement("button");
    button.type = "button";
    button.className = "link show-all";
    button.textContent = "Show all";
    button.addEventListener("click", function () {
      const folded = text.classList.toggle("folded");
      button.textContent = folded ? "Show all" : "Show less";
    });
    text.after(button);
  }

  // Triage: picking a candidate fills the correction fields with its values, to adjust.
  function prefillTriage(radio) {
    const article = radio.closest("article");
    const fields = article && article.querySelector(".triage-fields, .triage-prefill");
    const box = document.getElementById("corrections");
    if (!box) return;
    const data = fields ? fields.dataset : { category: "", priority: "", reply: "" };
    box.querySelector("[name=triage_category]").value = data.category || "";
    box.querySelector("[name=triage_priority]").value = data.priority || "";
    box.querySelector("[name=triage_reply]").value = data.reply || "";
  }

  // Triage: the category search narrows the list to the names containing what is typed and
  // selects the first of them (Enter or Tab then moves on).
  function categorySearch(search) {
    const select = document.getElementById("triage-category");
    if (!select) return;
    search.addEventListener("input", function () {
      const wanted = search.value.trim().toLowerCase().replace(/[\s-]+/g, "_");
      let first = null;
      select.querySelectorAll("option").forEach(function (option) {
        const match = !wanted || !option.value || option.value.toLowerCase().indexOf(wanted) !== -1;
        option.hidden = !match;
        if (match && option.value && !first) first = option;
      });
      if (wanted && first) { select.value = first.value; saveDraft(); }
    });
    search.addEventListener("keydown", function (event) {
      if (event.key === "Enter") { event.preventDefault(); select.focus(); }
    });
  }

  function toggleReason(number) {
    const box = document.querySelectorAll("input[name=reason_tags]")[number - 1];
    if (!box) return;
    box.checked = !box.checked;
    saveDraft();
  }

  // The guidelines stay open or closed as the reviewer last left them, item after item.
  function rememberGuidelines() {
    document.querySelectorAll("details[data-remember]").forEach(function (details) {
      const key = details.dataset.remember;
      try { if (localStorage.getItem(key) === "open") details.open = true; } catch (e) { /* off */ }
      details.addEventListener("toggle", function () {
        try { localStorage.setItem(key, details.open ? "open" : "closed"); } catch (e) { /* off */ }
      });
    });
  }

  function pick(label) {
    const radio = document.getElementById("choice-" + label);
    if (!radio) return;
    radio.checked = true;
    prefillTriage(radio);
    saveDraft();
    const card = document.getElementById("candidate-" + label);
    (card || radio).focus();
  }
  function editPicked() {
    const f = form();
    if (!f) return;
    let card = document.activeElement && document.activeElement.closest ? document.activeElement.closest("article.candidate") : null;
    const picked = f.querySelector("input[name=choice]:checked");
    if (!card && picked && picked.value !== "none") card = picked.closest("article.candidate");
    if (!card) card = f.querySelector("article.candidate.done");
    if (!card) return;
    const editor = card.querySelector("details.editor");
    if (!editor) return;
    editor.open = true;
    const radio = document.getElementById(editor.dataset.choice);
    if (radio) radio.checked = true;
    const t = editor.querySelector("textarea");
    t.focus();
    renderDiff(t);
    saveDraft();
  }
  function submitForm(id) {
    const target = document.getElementById(id);
    if (target) target.requestSubmit();
  }
  function toggleKeymap() {
    const dialog = document.getElementById("keymap");
    if (!dialog) return;
    if (dialog.open) dialog.close(); else dialog.showModal();
  }

  document.addEventListener("keydown", function (event) {
    const f = form();
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      if (f) { event.preventDefault(); f.requestSubmit(); }
      return;
    }
    if (event.key === "Escape" && typing(event.target)) { event.target.blur(); return; }
    if (typing(event.target) || event.altKey || event.ctrlKey || event.metaKey) return;
    // An open dialog has the keyboard (the shortcut list closes again with "?").
    const dialog = document.querySelector("dialog[open]");
    if (dialog && !(dialog.id === "keymap" && event.key === "?")) return;
    if (event.shiftKey && /^Digit[1-9]$/.test(event.code)) { event.preventDefault(); toggleReason(Number(event.code.slice(5))); }
    else if (/^[1-8]$/.test(event.key)) { event.preventDefault(); pick(event.key); }
    else if (event.key === "e") { event.preventDefault(); editPicked(); }
    else if (event.key === "x") { event.preventDefault(); pick("none"); }
    else if (event.key === "s") { event.preventDefault(); submitForm("skip-form"); }
    else if (event.key === "u") { event.preventDefault(); submitForm("undo-form"); }
    else if (event.key === "?") { event.preventDefault(); toggleKeymap(); }
    else if (event.key === "Enter" && f && f.querySelector("input[name=choice]:checked")
             && event.target.tagName !== "BUTTON" && event.target.tagName !== "SUMMARY") {
      event.preventDefault(); f.requestSubmit();
    }
  });

  // --- The undo banner counts its window down and goes when it ends ------------------------------
  function undoCountdown() {
    const banner = document.getElementById("undo-form");
    if (!banner) return;
    const until = Number(banner.dataset.undoUntil);
    const countdown = banner.querySelector(".undo-countdown");
    function tick() {
      const left = Math.ceil((until - Date.now()) / 1000);
      if (left <= 0) { banner.remove(); return; }
      countdown.textContent = left + " s left to undo";
      setTimeout(tick, 1000 - (Date.now() % 1000));
    }
    tick();
  }

  // A form that throws work away (regenerate) asks first.
  document.addEventListener("submit", function (event) {
    const message = event.target.dataset && event.target.dataset.confirm;
    if (message && !window.confirm(message)) event.preventDefault();
  });

  const keymapOpen = document.getElementById("keymap-open");
  if (keymapOpen) keymapOpen.addEventListener("click", toggleKeymap);
  document.body.addEventListener("htmx:afterSwap", setUp);
  setUp();
  bindOnce(document, "#triage-category-search", categorySearch);
  rememberGuidelines();
  undoCountdown();
})();
