// The Synapse console: plain JavaScript, no build step, no third-party code.
// Everything it shows comes from the console's JSON API; live updates over Server-Sent Events.
"use strict";

(function () {
  const base = document.body.dataset.base;
  const api = base + "/api";
  const state = {
    session: null,
    tasks: [],
    receivedAt: Date.now(),
    selected: null, // {requester, task_id}
    detail: null,
    detailKey: "",
  };

  // --- small helpers ------------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === undefined || child === null || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function show(value) {
    if (value === undefined || value === null) return "";
    return typeof value === "string" ? value : JSON.stringify(value);
  }

  function age(seconds) {
    const s = Math.max(0, Math.floor(seconds));
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
    return Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
  }

  function when(epoch) {
    return epoch ? new Date(epoch * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC") : "";
  }

  let flashTimer = null;

  function flash(text, isError) {
    const node = document.getElementById("flash");
    node.textContent = text;
    node.className = "flash " + (isError ? "bad" : "good");
    // A note goes by itself (an error stays longer): it is never what a person must click away.
    clearTimeout(flashTimer);
    flashTimer = setTimeout(() => { node.textContent = ""; }, isError ? 12000 : 5000);
  }

  async function call(method, path, body, root) {
    const headers = { Accept: "application/json" };
    if (method !== "GET") {
      headers["Content-Type"] = "application/json";
      headers["X-CSRF-Token"] = state.session ? state.session.csrf_token : "";
    }
    const response = await fetch((root || api) + path, {
      method,
      headers,
      credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status === 401) {
      window.location.assign(base);
      throw new Error("signed out");
    }
    const data = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(data.error || "HTTP " + response.status);
    return data;
  }

  // Form values: a field whose suggestion is not a string takes JSON (a number, true, ...).
  function parseValue(text, example) {
    if (example === undefined || example === null || typeof example === "string") return text;
    try {
      return JSON.parse(text);
    } catch (_) {
      return text;
    }
  }

  // --- task list ----------------------------------------------------------------------------

  function keyOf(task) {
    return task.requester + "/" + task.task_id;
  }

  function renderTasks() {
    const filter = document.getElementById("filter").value;
    const rows = document.getElementById("task-rows");
    const elapsed = (Date.now() - state.receivedAt) / 1000;
    const shown = state.tasks.filter((t) =>
      filter === "" ? true : filter === "@waiting" ? t.waiting_for_person : t.state === filter
    );
    rows.replaceChildren(
      ...shown.map((t) => {
        const selected = state.selected && keyOf(state.selected) === keyOf(t);
        const row = el(
          "tr",
          {
            class: [selected ? "selected" : "", t.waiting_for_person ? "waiting" : ""].join(" "),
            "data-task-id": t.task_id,
            "data-state": t.state,
            tabindex: "0",
            onclick: () => select(t),
            onkeydown: (event) => { if (event.key === "Enter") select(t); },
          },
          el("td", { class: "task-id" }, el("code", { text: t.task_id, title: t.task_id })),
          el("td", { text: t.type }),
          el("td", { text: t.role }),
          el("td", { text: t.partner }),
          el("td", {}, el("span", { class: "state s-" + t.state, text: t.state }),
            t.waiting_for_person ? el("span", { class: "badge", text: "answer" }) : null),
          el("td", { text: t.progress === null ? "" : t.progress + " %" }),
          el("td", { class: "age", text: t.final ? "" : age(t.age_seconds + elapsed) })
        );
        return row;
      })
    );
    document.getElementById("no-tasks").hidden = shown.length > 0;
  }

  function select(task) {
    state.selected = { requester: task.requester, task_id: task.task_id };
    state.detailKey = "";
    renderTasks();
    loadDetail();
  }

  async function loadDetail() {
    if (!state.selected) return;
    const sel = state.selected;
    const path = "/tasks/" + encodeURIComponent(sel.requester) + "/" + encodeURIComponent(sel.task_id);
    try {
      const detail = await call("GET", path);
      const stamp = detail.state + "@" + detail.updated_at + "#" + detail.audit.length + JSON.stringify(detail.panels || []);
      if (stamp === state.detailKey) return; // unchanged: keep what the person is typing
      state.detail = detail;
      state.detailKey = stamp;
      renderDetail(detail);
    } catch (error) {
      flash(String(error.message || error), true);
    }
  }

  // --- one task -----------------------------------------------------------------------------

  function definitionList(pairs) {
    return el("dl", {}, pairs.filter(([, v]) => v !== undefined && v !== null && v !== "")
      .map(([k, v]) => [el("dt", { text: k }), el("dd", {}, v)]));
  }

  function infoForm(task) {
    const need = task.need_info;
    const inputs = [];
    const form = el("form", { class: "answer", "data-testid": "info-form" });
    form.append(el("h3", { text: "Information needed" }));
    if (need.question) form.append(el("p", { class: "question", text: need.question }));
    if (need.required_by) form.append(el("p", { class: "muted", text: "Required by " + need.required_by }));
    for (const field of need.missing_fields) {
      const example = field.suggested_value !== null && field.suggested_value !== undefined
        ? field.suggested_value : (field.alternatives || [])[0];
      const input = el("input", {
        name: field.field,
        "data-field": field.field,
        required: true,
        value: show(field.suggested_value),
        "aria-label": field.field,
      });
      inputs.push([field.field, input, example]);
      form.append(
        el("fieldset", {},
          el("legend", {}, el("code", { text: field.field })),
          field.reason ? el("p", { class: "reason", text: field.reason }) : null,
          field.suggested_value !== null && field.suggested_value !== undefined
            ? el("p", { class: "muted", text: "Suggested: " + show(field.suggested_value) }) : null,
          input,
          (field.alternatives || []).length
            ? el("div", { class: "alternatives" }, "Alternatives: ",
                field.alternatives.map((alt) => el("button", {
                  type: "button", class: "chip", text: show(alt),
                  onclick: () => { input.value = show(alt); },
                })))
            : null)
      );
    }
    const notes = el("textarea", { name: "notes", rows: "2", "aria-label": "notes" });
    form.append(el("label", {}, "Notes (optional)", notes));
    form.append(el("button", { type: "submit", text: "Provide information" }));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const fields = {};
      for (const [name, input, example] of inputs) fields[name] = parseValue(input.value, example);
      try {
        await call("POST", "/tasks/" + encodeURIComponent(task.task_id) + "/info",
          { fields, notes: notes.value || null });
        flash("Information sent for " + task.task_id + ".");
        loadDetail();
      } catch (error) {
        flash(String(error.message || error), true);
      }
    });
    return form;
  }

  function humanPanel(task) {
    const need = task.need_human;
    const panel = el("div", { class: "answer", "data-testid": "human-panel" });
    panel.append(el("h3", { text: "A decision is needed" }));
    panel.append(definitionList([
      ["Reason", need.reason ? (need.reason.message + " (" + need.reason.code + ")") : ""],
      ["Summary", need.context ? need.context.task_summary : ""],
      ["Progress", need.context && need.context.current_progress !== null ? need.context.current_progress + " %" : ""],
      ["Blocked by", need.context ? need.context.blocked_reason : ""],
      ["Escalation level", String(need.escalation_level)],
      ["Deadline", need.deadline || ""],
    ]));
    const approved = [];
    if ((need.options || []).length) {
      const table = el("table", { class: "options" },
        el("thead", {}, el("tr", {}, el("th", { text: "Approve" }), el("th", { text: "Field" }),
          el("th", { text: "Value" }), el("th", { text: "Pros and cons" }), el("th", { text: "Confidence" }))));
      const body = el("tbody");
      for (const option of need.options) {
        const include = el("input", { type: "checkbox", checked: true, "aria-label": "approve " + option.field });
        const value = el("input", { value: show(option.value), "data-field": option.field, "aria-label": option.field });
        approved.push([option.field, include, value, option.value]);
        body.append(el("tr", {}, el("td", {}, include), el("td", {}, el("code", { text: option.field })),
          el("td", {}, value), el("td", { text: option.pros_cons || "" }),
          el("td", { text: option.confidence === null || option.confidence === undefined ? "" : option.confidence + " %" })));
      }
      table.append(body);
      panel.append(table);
    }
    const notes = el("textarea", { rows: "2", name: "notes", "aria-label": "decision notes" });
    const reason = el("textarea", { rows: "2", name: "rejection_reason", "aria-label": "rejection reason",
      placeholder: "Why the task is rejected (required to reject)" });
    panel.append(el("label", {}, "Notes (optional)", notes));
    panel.append(el("label", {}, "Rejection reason", reason));
    const send = async (action) => {
      const body = { action, notes: notes.value };
      if (action === "approve") {
        body.approved_fields = {};
        for (const [field, include, value, example] of approved) {
          if (include.checked) body.approved_fields[field] = parseValue(value.value, example);
        }
      } else {
        if (!reason.value.trim()) { flash("Give a reason to reject.", true); reason.focus(); return; }
        body.rejection_reason = reason.value;
      }
      try {
        await call("POST", "/tasks/" + encodeURIComponent(task.task_id) + "/decision", body);
        flash((action === "approve" ? "Approved " : "Rejected ") + task.task_id + ".");
        loadDetail();
      } catch (error) {
        flash(String(error.message || error), true);
      }
    };
    panel.append(el("div", { class: "actions" },
      el("button", { type: "button", class: "approve", text: "Approve", onclick: () => send("approve") }),
      el("button", { type: "button", class: "reject", text: "Reject", onclick: () => send("reject") })));
    return panel;
  }

  // A table another part of the agent adds to a task's page (the A2A push deliveries …).
  function panelTable(panel) {
    const columns = Object.keys(panel.rows[0]);
    const cell = (value) => (value === null || value === undefined ? ""
      : typeof value === "object" ? JSON.stringify(value) : String(value));
    return el("section", { class: "panel", "data-testid": "panel-" + panel.name },
      el("h3", { text: panel.title }),
      el("table", { class: "panel-table" },
        el("thead", {}, el("tr", {}, columns.map((c) => el("th", { text: c.replaceAll("_", " ") })))),
        el("tbody", {}, panel.rows.map((row) => el("tr", {},
          columns.map((c) => el("td", { "data-column": c, text: cell(row[c]) })))))));
  }

  function renderDetail(task) {
    const node = document.getElementById("detail");
    const parts = [
      el("h2", {}, "Task ", el("code", { "data-testid": "detail-task-id", text: task.task_id })),
      definitionList([
        ["State", el("span", { class: "state s-" + task.state, "data-testid": "detail-state", text: task.state })],
        ["Type", task.type],
        ["Role", task.role],
        ["Partner", task.partner],
        ["Requester", task.requester],
        ["Progress", task.progress === null ? "" : task.progress + " %"],
        ["Status", task.final ? "" : task.status_message],
        ["Created", when(task.created_at)],
        ["Updated", when(task.updated_at)],
      ]),
      el("h3", { text: "Payload" }),
      el("pre", { text: JSON.stringify(task.payload, null, 2) }),
    ];
    if (task.role === "requester" && task.need_info) parts.push(infoForm(task));
    if (task.role === "requester" && task.need_human) {
      parts.push(humanPanel(task));
      if (task.state === "need_human") {
        // Tell the other reviewers someone is on it (need_human → human_deciding, ours only).
        call("POST", "/tasks/" + encodeURIComponent(task.task_id) + "/deciding", {}).catch(() => {});
      }
    }
    for (const panel of task.panels || []) parts.push(panelTable(panel));
    if (task.result) parts.push(el("h3", { text: "Result" }), el("pre", { "data-testid": "result", text: JSON.stringify(task.result, null, 2) }));
    if (task.error) parts.push(el("h3", { text: "Error" }), el("pre", { "data-testid": "error", text: JSON.stringify(task.error, null, 2) }));
    if (task.reject) parts.push(el("h3", { text: "Rejected" }), el("pre", { text: JSON.stringify(task.reject, null, 2) }));
    if (task.refusal) parts.push(el("h3", { text: "Refused" }), el("pre", { text: JSON.stringify(task.refusal, null, 2) }));
    if (task.role === "requester" && !task.final) {
      parts.push(el("div", { class: "actions" }, el("button", {
        type: "button", class: "secondary", text: "Cancel task",
        onclick: async () => {
          try {
            await call("POST", "/tasks/" + encodeURIComponent(task.task_id) + "/cancel", {});
            flash("Cancel requested for " + task.task_id + ".");
          } catch (error) { flash(String(error.message || error), true); }
        },
      })));
    }
    parts.push(el("h3", { text: "Audit trail" }));
    parts.push(task.audit.length
      ? el("table", { class: "audit", "data-testid": "audit" },
          el("thead", {}, el("tr", {}, ["When", "Who", "Action", "Detail", "Message"].map((h) => el("th", { text: h })))),
          el("tbody", {}, task.audit.map((a) => el("tr", {},
            el("td", { text: when(a.at).slice(11) }), el("td", { class: "actor", text: a.actor }),
            el("td", { class: "action", text: a.action }),
            el("td", {}, el("code", { text: JSON.stringify(a.detail) })),
            el("td", {}, el("code", { text: a.message_id || "" }))))))
      : el("p", { class: "muted", text: "Nobody answered this task here yet." }));
    parts.push(el("h3", { text: "History" }));
    parts.push(el("table", { class: "history" },
      el("thead", {}, el("tr", {}, ["When", "From", "To", "Event"].map((h) => el("th", { text: h })))),
      el("tbody", {}, task.history.map((h) => el("tr", {},
        el("td", { text: when(h.at).slice(11) }), el("td", { text: h.from_state }),
        el("td", { text: h.to_state }), el("td", { text: h.event }))))));
    node.replaceChildren(...parts);
  }

  // --- live updates -------------------------------------------------------------------------

  function connect() {
    const live = document.getElementById("live");
    const source = new EventSource(api + "/events");
    source.addEventListener("open", () => { live.textContent = "live"; live.className = "live on"; });
    source.addEventListener("error", () => { live.textContent = "reconnecting"; live.className = "live off"; });
    source.addEventListener("signed_out", () => { source.close(); window.location.assign(base); });
    source.addEventListener("tasks", (event) => {
      const data = JSON.parse(event.data);
      state.tasks = data.tasks;
      state.receivedAt = Date.now();
      renderTasks();
      if (state.selected) loadDetail();
    });
  }

  // --- start --------------------------------------------------------------------------------

  // The new-task form offers what the chosen partner offers (its capability_response).
  async function offer(partner) {
    const types = document.getElementById("task-types");
    const offered = document.getElementById("offered");
    const form = document.getElementById("submit-form");
    types.replaceChildren();
    offered.textContent = "Asking " + partner + " what it offers…";
    try {
      const answer = await call("GET", "/partners/" + encodeURIComponent(partner) + "/capabilities");
      const names = answer.capabilities.map((c) => c.name);
      for (const c of answer.capabilities) {
        types.append(el("option", { value: c.name, text: c.description || "" }));
      }
      offered.textContent = names.length ? partner + " offers: " + names.join(", ") : partner + " offers nothing.";
      if (!names.includes(form.task_type.value)) form.task_type.value = names[0] || "";
    } catch (error) {
      offered.textContent = "Could not ask " + partner + ": " + String(error.message || error);
    }
  }

  async function start() {
    state.session = await call("GET", "/session");
    document.getElementById("reviewer").textContent =
      state.session.reviewer.user_name || state.session.reviewer.user_id;
    document.getElementById("agent").textContent = state.session.agent_id;
    const filter = document.getElementById("filter");
    for (const s of state.session.states) filter.append(el("option", { value: s, text: s }));
    filter.addEventListener("change", renderTasks);
    const partner = document.getElementById("partner");
    for (const p of state.session.partners) partner.append(el("option", { value: p, text: p }));
    partner.addEventListener("change", () => offer(partner.value));
    if (partner.value) offer(partner.value);
    document.getElementById("submit-form").addEventListener("submit", async (event) => {
      event.preventDefault();
      const form = event.target;
      let payload;
      try {
        payload = JSON.parse(form.payload.value || "{}");
      } catch (error) {
        flash("The payload is not JSON: " + error.message, true);
        return;
      }
      try {
        const task = await call("POST", "/tasks", { partner: form.partner.value, task_type: form.task_type.value, payload });
        flash("Requested " + task.task_id + ".");
        select(task);
      } catch (error) {
        flash(String(error.message || error), true);
      }
    });
    document.getElementById("signout").addEventListener("click", async () => {
      try { await call("POST", "/logout", {}, base); } catch (_) { /* already out */ }
      window.location.assign(base);
    });
    setInterval(renderTasks, 1000);
    connect();
  }

  start().catch((error) => flash(String(error.message || error), true));
})();
