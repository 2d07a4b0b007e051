// Review workbench: keyboard shortcuts, the edit diff, and drafts that survive a reload.
// No inline script anywhere: the page passes what it needs in data- attributes.
//
// What this script needs from templates/review/item.html (change both together):
//   #review[data-draft-key][data-decided]   the page; data-decided once the server has it
//   #review[data-undo-window-s]             how long a decision can be undone
//   #decision-form[data-candidate-ids]      the decision form (absent: nothing to decide) and
//     the candidates' ids as the server had them at the last poll; polls swap it while
//     candidates arrive, keeping [hx-preserve] parts (each candidate's pick and editor,
//     #verdict, #shown-at) as they are, matched by candidate id
//   input[name=shown_candidates]            filled on submit with the ids the page shows
//   #stale-page                             says the page was out of date
//   article.candidate[data-label][data-candidate-id]  a candidate, L its number (1, 2, …)
//   .candidate-number                       a number inside a preserved part, renewed here
//   input[name=choice]                      picking a candidate (#choice-none: none acceptable)
//   details.editor[data-choice=<radio id>]  its editor, holding
//     textarea[data-original] and .diff     the edit and its word diff
//   #comment, input[name=reason_tags]       the comment and reasons
//   #corrections, [name=correction_category|priority|reply]  triage fields, filled on a pick from
//     the candidate's .triage-fields or .triage-prefill [data-category|priority|reply]
//   #triage-category[role=combobox]         the category box, its #triage-category-list
//   #skip-form, #undo-form                  what "s" and "u" submit
//   #undo-form[data-undo-until]             the undo window's end (epoch ms), counted down
//   #key-hint                               says why a key did nothing
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
  // A draft is the round's (the key ends with its generation): a new round ("try again",
  // regenerate) starts afresh, and the drafts of the item's earlier rounds go.
  if (draftKey) {
    const itemPrefix = draftKey.slice(0, draftKey.lastIndexOf(":") + 1);
    try {
      Object.keys(localStorage).forEach(function (key) {
        if (key.indexOf(itemPrefix) === 0 && key !== draftKey) localStorage.removeItem(key);
      });
    } catch (e) { /* storage off */ }
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
    const editor = textarea.closest("details.editor");
    const box = editor.querySelector(".diff");
    if (!box) return;
    box.replaceChildren();
    // A tool call's edit is its fields: the calls as written, then as the fields now say.
    const calls = editor.querySelector(".tool-touched");
    const touched = calls && calls.value === "1";
    const before = (touched ? toolCallsText(editor, true) : "") + (textarea.dataset.original || "");
    const after = (touched ? toolCallsText(editor, false) : "") + textarea.value;
    const parts = Diff.diffWordsWithSpace(before, after, { timeout: DIFF_TIMEOUT_MS });
    if (parts === undefined) {
      box.textContent = "Too many changes to show word by word.";
      return;
    }
    if (parts.every(function (p) { return !p.added && !p.removed; })) {
      box.textContent = "No changes yet.";
      return;
    }
    groupChanges(parts).forEach(function (part) {
      const tag = part.added ? "ins" : part.removed ? "del" : "";
      const node = tag ? document.createElement(tag) : document.createTextNode(part.value);
      if (tag) node.textContent = part.value;
      box.appendChild(node);
    });
  }
  // A candidate's tool calls as one line each, "name(argument: value, …)", from the editor's
  // fields: as the page rendered them (`original`), or as the reviewer has them now.
  function toolCallsText(editor, original) {
    return Array.prototype.map.call(editor.querySelectorAll(".tool-call-editor"), function (set) {
      const choice = set.querySelector(".tool-choice");
      const chosen = original
        ? (Array.prototype.find.call(choice.options, function (o) { return o.defaultSelected; }) || choice.options[0]).value
        : choice.value;
      const fields = set.querySelector(".tool-arguments[data-tool='" + CSS.escape(chosen) + "']");
      const values = fields ? Array.prototype.map.call(fields.querySelectorAll("input, select"), function (input) {
        const label = set.querySelector("label[for='" + CSS.escape(input.id) + "'] code");
        const value = original
          ? (input.tagName === "SELECT"
            ? ((Array.prototype.find.call(input.options, function (o) { return o.defaultSelected; }) || {}).value || "")
            : input.defaultValue)
          : input.value;
        return (label ? label.textContent : input.name) + ": " + value;
      }) : [];
      return chosen + "(" + values.join(", ") + ")\n";
    }).join("");
  }
  // Changes separated only by spaces or one unchanged word read as one rewrite: "<del>the
  // cat sat</del><ins>a dog ran</ins>", not three swaps with the spaces between them.
  // (The server's word_diff in templatetags/markup.py groups the same way.)
  function groupChanges(parts) {
    const grouped = [];
    let removed = "", added = "", pending = "";
    function flush() {
      if (removed) grouped.push({ removed: true, value: removed });
      if (added) grouped.push({ added: true, value: added });
      removed = added = "";
    }
    parts.forEach(function (part) {
      if (part.added || part.removed) {
        if (pending) { removed += pending; added += pending; pending = ""; }
        if (part.added) added += part.value; else removed += part.value;
        return;
      }
      const inChange = removed || added;
      if (inChange && part.value.trim().split(/\s+/).filter(Boolean).length <= 1 && !pending) {
        pending = part.value;  // absorbed if another change follows it
        return;
      }
      flush();
      if (pending) { grouped.push({ value: pending }); pending = ""; }
      grouped.push({ value: part.value });
    });
    flush();
    if (pending) grouped.push({ value: pending });
    return grouped;
  }
  function debounced(run, pauseMs) {
    let timer = null;
    return function () { clearTimeout(timer); timer = setTimeout(run, pauseMs); };
  }

  // --- Drafts: what was picked, edited, ticked and written, kept in localStorage ----------------
  function saveDraft() {
    const f = form();
    if (!f || !draftKey) return;
    const draft = { choice: null, edits: {}, tags: [], comment: "", corrections: {}, ratings: {}, tools: {} };
    // A touched tool call's fields (all of them: the tool may have changed), so that a
    // reload, or a submit the server refused, keeps what the reviewer typed.
    f.querySelectorAll("details.editor").forEach(function (editor) {
      const mark = editor.querySelector(".tool-touched");
      if (!mark || mark.value !== "1") return;
      draft.tools[mark.name] = "1";
      editor.querySelectorAll(".tool-call-editor input, .tool-call-editor select").forEach(function (input) {
        draft.tools[input.name] = input.value;
      });
    });
    f.querySelectorAll(".rating select").forEach(function (r) { if (r.value) draft.ratings[r.name] = r.value; });
    f.querySelectorAll("[name^=correction_]").forEach(function (input) { draft.corrections[input.name] = input.value; });
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
    Object.keys(draft.ratings || {}).forEach(function (name) {
      const r = f.querySelector(".rating select[name='" + CSS.escape(name) + "']");
      if (r) r.value = draft.ratings[name];
    });
    Object.keys(draft.corrections || {}).forEach(function (name) {
      const input = f.querySelector("[name='" + CSS.escape(name) + "']");
      if (input) input.value = draft.corrections[name];
    });
    Object.keys(draft.tools || {}).forEach(function (name) {
      const input = f.querySelector("[name='" + CSS.escape(name) + "']");
      if (!input) return;
      input.value = draft.tools[name];
      const editor = input.closest("details.editor");
      editor.open = true;
      if (input.classList.contains("tool-choice")) input.dispatchEvent(new Event("change"));
    });
    f.querySelectorAll("details.editor[open] textarea[data-original]").forEach(renderDiff);
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
    relabel();
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
    // A tool call's editor: the chosen tool's argument fields show, and editing picks it.
    bindOnce(f, "select.tool-choice", function (select) {
      select.addEventListener("change", function () {
        select.closest("fieldset").querySelectorAll(".tool-arguments").forEach(function (box) {
          box.hidden = box.dataset.tool !== select.value;
        });
      });
    });
    bindOnce(f, ".tool-call-editor", function (box) {
      function touched() {
        const editor = box.closest("details");
        const radio = document.getElementById(editor.dataset.choice);
        if (radio) radio.checked = true;
        const mark = editor.querySelector(".tool-touched");
        if (mark) mark.value = "1";  // the fields now say what the reviewer wants
        renderSoon();
      }
      const renderSoon = debounced(function () {
        const t = box.closest("details").querySelector("textarea");
        if (t) renderDiff(t);
      }, DIFF_PAUSE_MS);
      box.addEventListener("input", touched);
      box.addEventListener("change", touched);
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

  // The numbers inside preserved parts (an editor's "candidate 2") follow the candidate's
  // number as the server renders it now: the ranking renumbers candidates.
  function relabel() {
    document.querySelectorAll("article.candidate[data-label]").forEach(function (card) {
      card.querySelectorAll(".candidate-number").forEach(function (number) {
        number.textContent = card.dataset.label;
      });
    });
  }

  // A long answer shows its first lines, with "Show all" to unfold it; unfolded stays
  // unfolded when a poll renders the text again.
  const unfolded = new Set();
  function foldIfLong(text) {
    const id = text.dataset.candidateId || "";
    if (unfolded.has(id)) return;
    text.classList.add("folded");
    if (text.scrollHeight <= text.clientHeight + 8) { text.classList.remove("folded"); return; }
    const button = document.createElement("button");
    button.type = "button";
    button.className = "link show-all";
    button.textContent = "Show all";
    button.addEventListener("click", function () {
      const folded = text.classList.toggle("folded");
      button.textContent = folded ? "Show all" : "Show less";
      if (folded) unfolded.delete(id); else unfolded.add(id);
    });
    text.after(button);
  }

  // Says, for a few seconds, why a key did nothing.
  let hintTimer = null;
  function hint(message) {
    const box = document.getElementById("key-hint");
    if (!box) return;
    box.textContent = message;
    box.hidden = false;
    clearTimeout(hintTimer);
    hintTimer = setTimeout(function () { box.hidden = true; }, 4000);
  }

  // The candidates the page shows, by id, in its order.
  function shownCandidateIds() {
    return Array.prototype.map.call(
      document.querySelectorAll("#decision-form article.candidate[data-candidate-id]"),
      function (card) { return card.dataset.candidateId; });
  }
  // Refuses a decision made on a page whose candidates are not the server's (one shown twice,
  // one missing): the page reloads, the draft keeps the pick and what was typed.
  function candidatesAgree(f) {
    const shown = shownCandidateIds();
    const stored = (f.dataset.candidateIds || "").split(",").filter(Boolean);
    const field = f.querySelector("input[name=shown_candidates]");
    if (field) field.value = shown.join(",");
    const agree = shown.length === stored.length && new Set(shown).size === shown.length
      && stored.every(function (id) { return shown.indexOf(id) !== -1; });
    if (!agree) {
      const box = document.getElementById("stale-page");
      if (box) {
        box.textContent = "This page's candidates were out of date, so nothing was submitted. Reloading it; your pick and edits are kept.";
        box.hidden = false;
      }
      saveDraft();
      setTimeout(function () { window.location.reload(); }, 1500);
    }
    return agree;
  }

  // Triage: picking a candidate fills the correction fields with its values, to adjust.
  function prefillTriage(radio) {
    const article = radio.closest("article");
    const fields = article && article.querySelector(".triage-fields, .triage-prefill");
    const box = document.getElementById("corrections");
    if (!box) return;
    const data = fields ? fields.dataset : { category: "", priority: "", reply: "" };
    box.querySelector("[name=correction_category]").value = data.category || "";
    box.querySelector("[name=correction_priority]").value = data.priority || "";
    box.querySelector("[name=correction_reply]").value = data.reply || "";
  }

  // Triage: the category is an editable combobox with a list of matches (the ARIA combobox
  // pattern, list autocomplete). Typing shows the matches: an exact name first, then names with
  // a word starting with what is typed, then names containing it. Arrow keys move through
  // them, Enter or Tab takes the highlighted one, Escape closes the list.
  function normalised(text) { return text.trim().toLowerCase().replace(/[\s-]+/g, "_"); }
  function matchRank(value, wanted) {
    const name = value.toLowerCase();
    if (!wanted) return 3;
    if (name === wanted) return 0;
    if (name.startsWith(wanted)) return 1;
    if (name.split("_").some(function (word, i, words) {
      return words.slice(i).join("_").startsWith(wanted);
    })) return 2;
    return name.indexOf(wanted) !== -1 ? 3 : -1;
  }
  function categoryCombobox(input) {
    const list = document.getElementById(input.getAttribute("aria-controls"));
    const status = document.getElementById("triage-category-status");
    if (!list) return;
    const options = Array.prototype.slice.call(list.querySelectorAll("[role=option]"));
    let active = null;
    function highlight(option) {
      options.forEach(function (o) { o.setAttribute("aria-selected", o === option ? "true" : "false"); });
      active = option;
      if (option) { input.setAttribute("aria-activedescendant", option.id); option.scrollIntoView({ block: "nearest" }); }
      else input.removeAttribute("aria-activedescendant");
    }
    function open(show) {
      list.hidden = !show;
      input.setAttribute("aria-expanded", show ? "true" : "false");
      if (!show) highlight(null);
    }
    function visible() {  // in the list's order, which filter() ranks
      return Array.prototype.filter.call(list.querySelectorAll("[role=option]"), function (o) { return !o.hidden; });
    }
    function filter() {
      const wanted = normalised(input.value);
      const ranked = options.map(function (o, index) { return { o: o, rank: matchRank(o.dataset.value, wanted), index: index }; });
      ranked.sort(function (a, b) { return (a.rank < 0) - (b.rank < 0) || a.rank - b.rank || a.index - b.index; });
      ranked.forEach(function (r) { r.o.hidden = r.rank < 0; list.appendChild(r.o); });
      const shown = visible();
      if (status) status.textContent = wanted ? (shown.length ? shown.length + " matching" : "No category matches “" + input.value.trim() + "”") : "";
      open(shown.length > 0);
      highlight(wanted && shown.length ? shown[0] : null);
    }
    function take(option) {
      input.value = option.dataset.value;
      open(false);
      if (status) status.textContent = "";
      saveDraft();
    }
    input.addEventListener("input", filter);
    // Focus selects what is there, so that typing replaces the picked candidate's category.
    input.addEventListener("focus", function () { if (input.value) input.select(); else filter(); });
    // Closing waits a moment so that a click on an option lands first; a quick return to the box
    // (a shortcut, then typing again) keeps the list that the typing opened.
    input.addEventListener("blur", function () {
      setTimeout(function () { if (document.activeElement !== input) open(false); }, 150);
    });
    input.addEventListener("keydown", function (event) {
      const shown = visible();
      const at = shown.indexOf(active);
      if (event.key === "ArrowDown" || event.key === "ArrowUp") {
        event.preventDefault();
        if (list.hidden) { filter(); return; }
        const step = event.key === "ArrowDown" ? 1 : -1;
        highlight(shown[(at + step + shown.length) % shown.length] || null);
      } else if (event.key === "Enter" && !event.ctrlKey && !event.metaKey) {
        if (active && !list.hidden) { event.preventDefault(); event.stopPropagation(); take(active); }
      } else if (event.key === "Tab" && active && !list.hidden) {
        take(active);
      } else if (event.key === "Escape" && !list.hidden) {
        event.preventDefault(); event.stopPropagation(); open(false);
      }
    });
    list.addEventListener("mousedown", function (event) {
      const option = event.target.closest("[role=option]");
      if (option) { event.preventDefault(); take(option); }
    });
  }

  function toggleReason(number) {
    const box = document.querySelectorAll("input[name=reason_tags]")[number - 1];
    if (!box) return;
    box.checked = !box.checked;
    saveDraft();
  }

  // The playbook stays open or closed as the reviewer last left it, item after item.
  function rememberPlaybook() {
    document.querySelectorAll("details[data-remember]").forEach(function (details) {
      const key = details.dataset.remember;
      try { if (localStorage.getItem(key) === "open") details.open = true; } catch (e) { /* off */ }
      details.addEventListener("toggle", function () {
        try { localStorage.setItem(key, details.open ? "open" : "closed"); } catch (e) { /* off */ }
      });
    });
  }

  function pick(label) {
    const card = label === "none" ? null
      : document.querySelector("#decision-form article.candidate[data-label='" + label + "']");
    const radio = label === "none" ? document.getElementById("choice-none")
      : card && card.querySelector("input[name=choice]");
    if (!radio) {
      if (card && card.classList.contains("failed")) hint("Candidate " + label + " failed: retry it, or pick another.");
      else if (card) hint("Candidate " + label + " has not arrived yet.");
      else if (form()) hint("There is no candidate " + label + ".");
      return;
    }
    radio.checked = true;
    prefillTriage(radio);
    saveDraft();
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
    const category = document.getElementById("triage-category");
    if (!editor && category) {  // triage: correct the picked candidate's fields, category first
      if (!picked) pick(card.dataset.label);
      category.focus();
      return;
    }
    if (!editor) return;
    editor.open = true;
    const radio = document.getElementById(editor.dataset.choice);
    if (radio) radio.checked = true;
    const t = editor.querySelector("textarea");
    (editor.querySelector(".tool-choice") || t).focus();  // a tool call: its tool first
    renderDiff(t);
    saveDraft();
  }
  // Ratings: "r" picks the candidate to rate (the focused one, else the picked one), the next
  // digit rates it. The candidate is kept by id: a poll may move its rating to a new card.
  const MODIFIERS = ["Shift", "CapsLock", "AltGraph", "Control", "Alt", "Meta"];
  let ratingFor = null;
  function startRating() {
    const f = form();
    if (!f) return;
    let card = document.activeElement && document.activeElement.closest ? document.activeElement.closest("article.candidate") : null;
    const picked = f.querySelector("input[name=choice]:checked");
    if (!card && picked && picked.value !== "none") card = picked.closest("article.candidate");
    if (!card || !card.querySelector(".rating select")) {
      hint("Pick or focus a candidate first (its number), then r and 1–5 rates it.");
      return;
    }
    ratingFor = card.dataset.candidateId;
    hint("Rate candidate " + card.dataset.label + ": 1 (worst) to 5 (best), 0 clears.");
  }
  function rate(candidateId, value) {
    const select = document.getElementById("rating-select-" + candidateId);
    const card = select && select.closest("article.candidate");
    if (!select || !card) { hint("That candidate is no longer on the page."); return; }
    select.value = value === "0" ? "" : value;
    hint(value === "0" ? "Candidate " + card.dataset.label + " is not rated."
      : "Candidate " + card.dataset.label + " rated " + value + " of 5.");
    saveDraft();
  }
  function tryAgain() {
    const f = form();
    const button = document.getElementById("try-again");
    if (f && button) f.requestSubmit(button);
  }
  // Sending a round back leaves an edit behind: ask first, as regenerating does.
  function editsPending(f) {
    return Array.prototype.some.call(f.querySelectorAll("textarea[data-original]"),
      function (t) { return t.value !== t.dataset.original; });
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
    // "r" was pressed: the next key rates (0 clears), any other ends it. A modifier alone
    // (Shift for the digits of an AZERTY keyboard) waits for the key it modifies.
    if (ratingFor && !MODIFIERS.includes(event.key)) {
      const candidateId = ratingFor;
      ratingFor = null;
      if (/^[0-5]$/.test(event.key)) { event.preventDefault(); rate(candidateId, event.key); return; }
    }
    if (event.key === "r") { event.preventDefault(); startRating(); return; }
    if (event.key === "t") { event.preventDefault(); tryAgain(); return; }
    if (event.shiftKey && /^Digit[1-9]$/.test(event.code)) { event.preventDefault(); toggleReason(Number(event.code.slice(5))); }
    else if (/^[1-8]$/.test(event.key)) { event.preventDefault(); pick(event.key); }
    else if (event.key === "e") { event.preventDefault(); editPicked(); }
    else if (event.key === "x") { event.preventDefault(); pick("none"); }
    else if (event.key === "s") { event.preventDefault(); submitForm("skip-form"); }
    else if (event.key === "u") {
      event.preventDefault();
      if (document.getElementById("undo-form")) submitForm("undo-form");
      else hint("Nothing to undo: a decision can be undone for " + (root.dataset.undoWindowS || "a few") + " s after it is saved, and that time has passed.");
    }
    else if (event.key === "?") { event.preventDefault(); toggleKeymap(); }
    else if (event.key === "Enter" && f && event.target.tagName !== "BUTTON"
             && event.target.tagName !== "SUMMARY" && event.target.tagName !== "A") {
      event.preventDefault(); f.requestSubmit();
    }
  });

  // A decision needs a pick, and a page that shows the server's candidates.
  document.addEventListener("submit", function (event) {
    const f = form();
    if (!f || event.target !== f) return;
    // "Try again" needs no pick: the whole round goes back with its ratings.
    if (event.submitter && event.submitter.id === "try-again") {
      if (editsPending(f) && !window.confirm("Try again? Your edits here are not sent and are lost.")) {
        event.preventDefault();
        return;
      }
      if (!candidatesAgree(f)) event.preventDefault();
      return;
    }
    if (!f.querySelector("input[name=choice]:checked")) {
      event.preventDefault();
      hint("Pick a candidate first (its number, or x for none acceptable); nothing was submitted.");
      return;
    }
    if (!candidatesAgree(f)) event.preventDefault();
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
  bindOnce(document, "#triage-category[role=combobox]", categoryCombobox);
  rememberPlaybook();
  undoCountdown();
})();
