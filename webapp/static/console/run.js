/* The run view: live topology, selected node panel, completion and throughput charts,
 * event timeline, run controls and instance adjustments (hot migration, adding and
 * removing instances), fed by the run's websocket (ws/runs/<id>/).
 *
 * Messages are JSON objects with a "type"; each type has one handler (HANDLERS). The
 * socket reconnects with exponential backoff and jitter, showing "reconnecting"; a
 * refusal (not logged in, no role, unknown run) stops the retries with a message.
 */
(function (global) {
  "use strict";
  const BP = global.BP;
  const config = BP.readJson("run-config");
  const HISTORY_S = 300;          // node level history kept for the sparkline
  const MAX_EVENTS = 300;
  const RATE_AVERAGE_S = 2;       // node rates shown as a moving average over about 2 s
  const THROUGHPUT_WINDOW_S = 4;  // the throughput chart's sliding window
  const HEADLINE_WINDOW_S = 10;   // the throughput figure in the header
  const BACKOFF_MIN_MS = 500;
  const BACKOFF_MAX_MS = 10000;
  const ACTIVE_RUN = ["pending", "running", "paused", "stopping"];

  const state = {
    snapshot: null,
    inputTotal: 0,                 // input bytes, once it exists (the driver writes a generated one)
    history: new Map(),            // node -> [{t, level, high, low}]
    rates: new Map(),              // node -> {in, out, t}: rates averaged over ~2 s
    completion: [],                // [seconds, fraction]; a continuous run: [seconds, age of the oldest waiting data]
    ingested: [],                  // a continuous run: [seconds, bytes taken in]
    unbounded: false,              // a continuous run has no "completed": it shows freshness
    throughput: [],                // [seconds, bytes/s]
    events: new Map(),             // id -> event
    openEvents: new Set(),         // ids of the events whose "why" is shown
    selected: null,
    socket: null,
    attempt: 0,
    retryTimer: null,
    everOpened: false,
    stopped: false,
    renderLog: [],                 // for the latency benchmark and the browser tests
    messages: 0,
  };

  const $ = (id) => document.getElementById(id);

  // -- connection ---------------------------------------------------------------------

  function setConnection(kind, text) {
    const pill = $("connection");
    pill.className = "pill conn-" + kind;
    pill.textContent = text;
    pill.setAttribute("data-state", kind);
  }

  function connect() {
    if (state.stopped) return;
    clearTimeout(state.retryTimer);
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + location.host + config.ws_path);
    state.socket = socket;
    let opened = false;
    setConnection("connecting", state.everOpened ? "reconnecting…" : "connecting…");
    socket.onopen = () => {
      opened = true;
      state.everOpened = true;
      state.attempt = 0;
      setConnection("live", "live");
    };
    socket.onmessage = (ev) => {
      let message;
      try { message = JSON.parse(ev.data); } catch (e) { return; }
      state.messages += 1;
      const handler = HANDLERS[message.type];
      if (handler) handler(message);
      else console.debug("console: no handler for message type", message.type);
    };
    socket.onclose = (ev) => {
      if (state.socket !== socket) return;
      if (ev.code === 4401 || ev.code === 4403 || ev.code === 4404) return refused(ev.code);
      if (!opened) return checkAccess().then((allowed) => allowed && retry());
      retry();
    };
  }

  async function checkAccess() {
    // A refused handshake looks like any network failure to the browser: ask the API.
    try {
      const r = await fetch(config.api, { credentials: "same-origin" });
      if (r.status === 401 || r.status === 403) { refused(4403); return false; }
      if (r.status === 404) { refused(4404); return false; }
    } catch (e) { /* the server is down: keep retrying */ }
    return true;
  }

  function refused(code) {
    state.stopped = true;
    const why = { 4401: "logged out: log in again", 4404: "no such run" };
    setConnection("refused", why[code] || "not allowed: log in again");
  }

  function retry() {
    const base = Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * Math.pow(2, state.attempt));
    const delay = Math.round(base * (0.8 + 0.4 * Math.random()));
    state.attempt += 1;
    const until = Date.now() + delay;
    const tick = () => {
      const left = Math.max(0, until - Date.now());
      setConnection("reconnecting", `reconnecting in ${(left / 1000).toFixed(1)} s`);
      if (left > 0) state.retryTimer = setTimeout(tick, Math.min(250, left));
      else connect();
    };
    tick();
  }

  // -- message handlers ---------------------------------------------------------------

  const HANDLERS = {
    snapshot: onSnapshot,
    pong: () => {},
    error: (m) => toast(m.detail, "error"),
  };

  function onSnapshot(snap) {
    const receivedMs = Date.now();
    state.snapshot = snap;
    recordHistory(snap);
    view.update(snap, state.rates);
    renderHeader(snap);
    renderSource(snap.source);
    renderAdjustment(snap.adjustment);
    mergeEvents(snap.events || []);
    renderSelected();
    scheduleCharts();
    const domMs = Date.now();
    const entry = { received_ms: receivedMs, dom_ms: domMs, time: snap.time, bench: snap.bench || null };
    state.renderLog.push(entry);
    if (state.renderLog.length > 2000) state.renderLog.shift();
    requestAnimationFrame(() => { entry.paint_ms = Date.now(); });
  }

  function recordHistory(snap) {
    const t = Date.parse(snap.time) / 1000 || Date.now() / 1000;
    for (const n of snap.nodes || []) {
      const st = n.state || {};
      if (typeof st.level !== "number") continue;
      const h = state.history.get(n.name) || [];
      h.push({ t, level: st.level, high: st.high_water, low: st.low_water, flagged: !!st.flagged });
      while (h.length && h[0].t < t - HISTORY_S) h.shift();
      state.history.set(n.name, h);
      // A tick's rates jump between 0 and bursts (batches finish in steps): average them.
      const prev = state.rates.get(n.name);
      const a = prev ? 1 - Math.exp(-Math.max(0, t - prev.t) / RATE_AVERAGE_S) : 1;
      const mix = (old, now) => (typeof now === "number" ? (old === undefined ? now : old + a * (now - old)) : old);
      state.rates.set(n.name, { t, in: mix(prev && prev.in, st.in_rate), out: mix(prev && prev.out, st.out_rate) });
    }
    const run = snap.run || {};
    state.unbounded = Boolean(snap.source && snap.source.unbounded);
    if (run.started_at && state.unbounded) {
      // No input total: the charts show how old the oldest waiting data is, and the
      // rate at which data is taken in.
      const lag = snap.source.lag;
      pushPoint(state.completion, run.elapsed_s, lag ? lag.age_s : 0);
      pushPoint(state.ingested, run.elapsed_s, run.input_bytes || 0);
      state.throughput = rateOf(state.ingested);
    } else if (run.started_at) {
      pushPoint(state.completion, run.elapsed_s, run.completed_fraction || 0);
      state.throughput = throughputOf(state.completion);
    }
  }

  function pushPoint(points, seconds, value) {
    const last = points[points.length - 1];
    if (!last || seconds > last[0]) points.push([seconds, value]);
    else if (seconds === last[0]) last[1] = value;
  }

  function rateOf(points, windowS) {
    // Bytes per second of a growing count over a sliding window.
    const span = windowS || THROUGHPUT_WINDOW_S;
    const out = [];
    let j = 0;
    for (let i = 1; i < points.length; i++) {
      while (j < i - 1 && points[i][0] - points[j + 1][0] >= span) j++;
      const dt = points[i][0] - points[j][0];
      if (dt > 0) out.push([points[i][0], Math.max(0, (points[i][1] - points[j][1]) / dt)]);
    }
    return out;
  }

  function throughputOf(points, windowS) {
    // Merged bytes per second over a sliding window (the sink merges in bursts).
    const span = windowS || THROUGHPUT_WINDOW_S;
    const total = state.inputTotal || config.input_bytes || 0;
    const out = [];
    let j = 0;
    for (let i = 1; i < points.length; i++) {
      while (j < i - 1 && points[i][0] - points[j + 1][0] >= span) j++;
      const dt = points[i][0] - points[j][0];
      if (dt > 0) out.push([points[i][0], Math.max(0, (points[i][1] - points[j][1]) * total / dt)]);
    }
    return out;
  }

  // -- header and controls ------------------------------------------------------------

  function renderHeader(snap) {
    const run = snap.run || {};
    const badge = $("run-status");
    badge.textContent = run.status;
    badge.className = "status status-" + run.status;
    badge.setAttribute("data-status", run.status);
    $("run-elapsed").textContent = BP.duration(run.elapsed_s);
    const unbounded = Boolean(snap.source && snap.source.unbounded);
    $("run-completed").textContent = unbounded ? "never ends" : BP.pct(run.completed_fraction, 1);
    // A generated input is written by the run's driver before the source starts.
    const preparing = run.preparing;
    $("run-preparing").hidden = !preparing;
    if (preparing) $("run-preparing").textContent = `preparing input: ${BP.pct(preparing.fraction)}`;
    if (run.input_total) state.inputTotal = run.input_total;
    $("run-chunks").textContent = `${run.merged_chunks || 0} / ${run.chunks_total ?? "?"}`;
    $("run-migrated").textContent = run.migrated_segments ?? 0;
    const flagged = (snap.nodes || []).filter((n) => n.state && n.state.flagged).map((n) => n.name);
    $("run-flagged").textContent = flagged.length ? flagged.join(", ") : "none";
    const links = snap.links || [];
    const moves = links.filter((l) => l.migrated_from).map((l) => `${l.migrated_from} → ${l.target}`);
    // A light branch can take several heavy ones' data; the snapshot names one per link.
    const named = new Set(links.filter((l) => l.migrated_from).map((l) => l.migrated_from));
    for (const l of links) {
      if (l.migrating && !l.migrated_from && !named.has(l.target)) moves.push(`${l.target} → lighter branch`);
    }
    $("run-migrating").textContent = moves.length ? moves.join(", ") : "none";
    $("run-migrating").classList.toggle("migrating", moves.length > 0);
    const p = run.policy || {};
    $("run-policy").textContent = [p.throttling, p.routing, p.migration, p.placement].filter(Boolean).join(" · ");
    $("run-emulated").hidden = !run.emulated;
    if (run.error) toast(run.error, "error", "run-error");
    const active = ACTIVE_RUN.includes(run.status);
    $("btn-pause").disabled = !(run.status === "running" || run.status === "pending");
    $("btn-resume").disabled = run.status !== "paused";
    // A stopping run is already finishing what it took in; it can still be cancelled.
    $("btn-stop").disabled = !active || run.status === "stopping";
    if ($("btn-cancel")) $("btn-cancel").disabled = !active;
    document.body.setAttribute("data-run-status", run.status);
    if (snap.final && state.everOpened) setConnection("ended", "run ended");
  }

  function renderSource(source) {
    // What the run reads; for a landing folder or a stream, how far its results are
    // exact and what waits outside it (the source node shows the same lag).
    if (!source) return;
    $("run-source").textContent = source.what;
    $("run-source").title = source.what;
    if (!source.unbounded || !$("run-exact")) return;
    $("run-exact").textContent = `exact up to ${source.exact_up_to || "–"}`;
    $("run-lag").textContent = BP.lagText(source);
  }

  const CONFIRM = {
    stop: config.source && config.source.unbounded
      ? "Stop this run? It reads nothing new and completes once what it took in is merged."
      : "Stop this run? It cannot be resumed.",
    cancel: "Cancel this run now? What it took in and has not merged is abandoned.",
  };

  async function control(verb) {
    if (CONFIRM[verb] && !confirm(CONFIRM[verb])) return;
    const r = await BP.api("POST", config.api + verb + "/");
    report(r, `run ${verb}`);
  }

  async function nodeAction(stop) {
    const node = state.selected;
    if (!node) return;
    const question = stop
      ? `Stop migrating the data of ${node}'s branch? Its data goes back to its own branch.`
      : `Migrate the data of ${node}'s branch to the lightest branch now?`;
    if (!confirm(question)) return;
    const r = await BP.api("POST", config.api + (stop ? "stop-migrating/" : "migrate/"), { node });
    report(r, stop ? "stop migrating" : "migrate");
  }

  async function adjust(action) {
    const name = state.selected;
    const node = selectedNode();
    if (!node) return;
    const worker = $("worker-select").value;
    const where = worker || "any live worker";
    const body = { action };
    let question;
    if (action === "hot_migrate") {
      body.node = name;
      question = `Hot-migrate ${name} to ${where}? A new instance of stage ${node.stage} takes over ` +
        `its keys and state; ${name} retires once the adjustment's markers have passed it.`;
    } else if (action === "add_instance") {
      body.stage = node.stage;
      question = `Add an instance to stage ${node.stage} on ${where}? The stage's keys are ` +
        "shared out again over its instances, state included.";
    } else {
      body.node = name;
      question = `Remove instance ${name}? Its keys and state go to the other instances of ` +
        `stage ${node.stage}.`;
    }
    if (worker && action !== "remove_instance") body.worker = worker;
    if (!confirm(question)) return;
    const r = await BP.api("POST", config.api + "adjust/", body);
    report(r, action.replace("_", " "));
  }

  async function loadWorkers() {
    const select = $("worker-select");
    const r = await BP.api("GET", config.workers_api);
    const chosen = select.value;
    const options = [BP.el("option", { value: "" }, "any live worker")];
    if (r.ok && Array.isArray(r.data)) {
      for (const w of r.data) options.push(BP.el("option", { value: w.name }, `${w.name} (${w.host}, pid ${w.pid})`));
    } else {
      options.push(BP.el("option", { value: "", disabled: true }, `live workers unknown (HTTP ${r.status})`));
    }
    select.replaceChildren(...options);
    // A refresh must not undo the operator's choice while that worker is still alive.
    if (Array.from(select.options).some((o) => o.value === chosen)) select.value = chosen;
  }

  const ADJUSTMENT_KINDS = { migrate: "hot migration", scale_out: "scale out", scale_in: "scale in",
    failover: "failover" };

  function renderAdjustment(adj) {
    const strip = $("adjustment");
    if (!adj) { strip.hidden = true; return; }
    strip.hidden = false;
    strip.setAttribute("data-status", adj.status);
    strip.setAttribute("data-kind", adj.kind);
    strip.setAttribute("data-version", adj.version);
    strip.title = adj.reason || "";
    $("adj-kind").textContent = `adjustment ${adj.version} · ${ADJUSTMENT_KINDS[adj.kind] || adj.kind}`;
    $("adj-status").textContent = adj.status.replace("_", " ");
    const change = (adj.removed || []).map((n) => "− " + n).concat((adj.added || []).map((n) => "+ " + n));
    $("adj-change").textContent = change.join(" ");
    const outcome = adj.outcome || {};
    const size = (adj.subgraph || []).length;
    let progress;
    if (adj.status === "running") {
      const markers = (adj.markers || []).length;
      progress = `aligned ${(adj.aligned || []).length}/${size}` +
        (markers ? ` · ${markers} marker${markers === 1 ? "" : "s"} on the way` : "");
    } else if (adj.status === "complete") {
      const gap = outcome.sink_max_gap_s;
      progress = `aligned ${size}/${size} · done in ${seconds(outcome.seconds)}` +
        (typeof gap === "number" ? ` · sink's longest pause ${seconds(gap)}` : "");
    } else {
      progress = outcome.reason || adj.reason || "";
    }
    $("adj-progress").textContent = progress;
  }

  function seconds(s) {
    return typeof s === "number" ? s.toFixed(2) + " s" : "–";
  }

  function report(r, what) {
    const detail = (r.data && r.data.detail) || `HTTP ${r.status}`;
    if (r.ok) toast(detail, "ok");
    else if (r.status === 403) toast(`${detail[0].toUpperCase()}${detail.slice(1)} (HTTP 403)`, "refused");
    else toast(`${what}: ${detail} (HTTP ${r.status})`, "error");
    refreshEvents();
  }

  let toastTimer = null;
  function toast(text, kind, key) {
    const box = $("toast");
    if (key && box.getAttribute("data-key") === key && !box.hidden) return;
    box.textContent = text;
    box.className = "toast toast-" + kind;
    box.setAttribute("data-kind", kind);
    box.setAttribute("data-key", key || "");
    box.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => { box.hidden = true; }, kind === "ok" ? 5000 : 12000);
  }

  // -- selected node panel ------------------------------------------------------------

  function select(name) {
    state.selected = name;
    $("panel-empty").hidden = true;
    $("panel-gone").hidden = true;
    $("panel-node").hidden = false;
    renderSelected();
    loadWorkers();
  }

  function selectedNode() {
    const name = state.selected;
    if (!name || !state.snapshot) return null;
    return (state.snapshot.nodes || []).find((n) => n.name === name) || null;
  }

  function renderSelected() {
    const name = state.selected;
    if (!name || !state.snapshot) return;
    const node = selectedNode();
    if (!node) return deselectGone(name);
    const st = node.state || {};
    $("sel-name").textContent = name;
    $("sel-kind").textContent = node.kind + (node.stage && node.stage !== name ? ` · stage ${node.stage}` : "");
    const cls = BP.levelClass(st.level);
    const lvl = $("sel-level");
    lvl.textContent = BP.pct(st.level, 1);
    lvl.className = "value " + cls;
    $("sel-flag").textContent = st.flagged ? "⚑ flagged" : "not flagged";
    $("sel-flag").className = st.flagged ? "flag-text on" : "flag-text";
    $("sel-buffer").textContent = `${BP.bytes(st.buffered_bytes)} of ${BP.bytes(node.capacity_bytes)}`;
    $("sel-thresholds").textContent = `H ${BP.pct(st.high_water)} · W ${BP.pct(st.low_water)}`;
    $("sel-k").textContent = typeof st.rate_coefficient === "number" ? st.rate_coefficient.toFixed(2) : "–";
    $("sel-speed").textContent = typeof st.speed === "number"
      ? st.speed.toFixed(2) + (st.in_backpressure ? " (backpressure)" : "") : "–";
    const r = state.rates.get(name) || { in: st.in_rate, out: st.out_rate };
    $("sel-rates").textContent = `${BP.rate(r.in)} in · ${BP.rate(r.out)} out`;
    const out = (state.snapshot.links || []).filter((l) => l.migrated_from === name).map((l) => l.target);
    const into = (state.snapshot.links || []).filter((l) => l.target === name && l.migrated_from).map((l) => l.migrated_from);
    $("sel-migration").textContent = out.length ? `its data goes to ${out.join(", ")}`
      : into.length ? `takes data of ${into.join(", ")}` : "none";
    renderInstance(node);
    drawSparkline(state.history.get(name) || []);
    renderNodeEvents(name);
  }

  function renderInstance(node) {
    const instance = node.instance || {};
    const status = instance.status || "active";
    $("sel-instance").textContent = status + (instance.aligning ? " · aligning" : "");
    const st = node.state || {};
    // An emulated node (a declared rate) is a resource of its own: no worker to name.
    const own = st.resource === node.name ? "none: its declared rate limits it (emulated)" : st.resource;
    $("sel-worker").textContent = instance.worker || own || "any worker";
    const perRecord = typeof st.capacity_rps === "number" ? `, ${BP.count(st.capacity_rps)} records/s` : "";
    $("sel-capacity").textContent = typeof st.capacity_bps === "number" ? `${BP.rate(st.capacity_bps)}${perRecord} measured` : "not measured yet";
    $("sel-busy").textContent = typeof st.busy === "number" ? BP.pct(st.busy) : "–";
    $("sel-stage").textContent = node.stage;
    $("instance-actions").hidden = node.kind !== "operator";
    const active = ACTIVE_RUN.includes((state.snapshot.run || {}).status);
    $("btn-hot-migrate").disabled = !active || status !== "active";
    $("btn-remove-instance").disabled = !active || status !== "active";
    $("btn-add-instance").disabled = !active;
  }

  function deselectGone(name) {
    // The instance was removed by an adjustment: its panel has nothing left to show.
    state.selected = null;
    $("panel-node").hidden = true;
    $("panel-empty").hidden = false;
    const gone = $("panel-gone");
    gone.textContent = `${name} is no longer part of the run (removed by an adjustment).`;
    gone.hidden = false;
  }

  function drawSparkline(points) {
    const svg = $("sparkline");
    const W = 320, H = 100, padL = 32, padR = 6, padT = 10, padB = 16;
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    const x0 = padL, x1 = W - padR, y0 = H - padB, y1 = padT;
    const now = points.length ? points[points.length - 1].t : Date.now() / 1000;
    const span = Math.max(30, Math.min(HISTORY_S, points.length ? now - points[0].t : 30));
    const X = (t) => x1 - (now - t) / span * (x1 - x0);
    const Y = (v) => y0 - v * (y0 - y1);
    for (const v of [0, BP.LEVEL_WARN, BP.LEVEL_BAD, 1]) {
      svg.appendChild(BP.svg("line", { x1: x0, x2: x1, y1: Y(v), y2: Y(v), class: "grid" }));
      svg.appendChild(BP.svg("text", { x: x0 - 4, y: Y(v) + 3, class: "axis", "text-anchor": "end" }, (v * 100) + "%"));
    }
    svg.appendChild(BP.svg("text", { x: x0, y: H - 3, class: "axis" }, `-${Math.round(span)} s`));
    svg.appendChild(BP.svg("text", { x: x1, y: H - 3, class: "axis", "text-anchor": "end" }, "now"));
    if (points.length < 2) return;
    const line = (key) => points.filter((p) => typeof p[key] === "number")
      .map((p, i) => `${i ? "L" : "M"}${X(p.t).toFixed(1)},${Y(p[key]).toFixed(1)}`).join(" ");
    const step = (key) => {
      let d = "", prev = null;
      for (const p of points) {
        if (typeof p[key] !== "number") continue;
        const x = X(p.t).toFixed(1), y = Y(p[key]).toFixed(1);
        d += prev === null ? `M${x},${y}` : `H${x}V${y}`;
        prev = y;
      }
      return d;
    };
    const area = line("level") + ` L${X(points[points.length - 1].t).toFixed(1)},${y0} L${X(points[0].t).toFixed(1)},${y0} Z`;
    svg.appendChild(BP.svg("path", { d: area, class: "spark-area " + BP.levelClass(points[points.length - 1].level) }));
    svg.appendChild(BP.svg("path", { d: line("level"), class: "spark-level" }));
    svg.appendChild(BP.svg("path", { d: step("high"), class: "spark-high" }));
    svg.appendChild(BP.svg("path", { d: step("low"), class: "spark-low" }));
  }

  function renderNodeEvents(name) {
    const list = $("sel-events");
    const events = Array.from(state.events.values()).filter((e) => e.node === name)
      .sort((a, b) => b.id - a.id).slice(0, 12);
    list.replaceChildren(...events.map(eventRow));
    if (!events.length) list.appendChild(BP.el("li", { class: "muted" }, "no events for this node yet"));
  }

  // -- events -------------------------------------------------------------------------

  const CATEGORIES = {
    set_flag: "flag", clear_flag: "flag", set_thresholds: "threshold",
    set_rate: "rate", set_speed: "rate", stepwise_signal: "rate", set_credits: "rate",
    set_shares: "shares", start_migration: "migration", stop_migration: "migration",
    move_queued: "migration",
    operator_migrate: "operator", operator_stop_migrating: "operator", operator_refused: "refused",
    action_refused: "refused", scale_out_request: "rate", move_key_groups: "adjustment",
    operator_hot_migrate: "operator", operator_add_instance: "operator", operator_remove_instance: "operator",
    worker_lost: "adjustment", worker_asked: "adjustment", placed: "adjustment",
    capacity_measured: "adjustment",
  };

  function category(kind) {
    if (CATEGORIES[kind]) return CATEGORIES[kind];
    if (kind.startsWith("run_") || kind === "driver" || kind === "driver_resent" || kind === "source_done" || kind === "input_generated") return "run";
    if (kind.startsWith("adjust_")) return "adjustment";
    return "other";
  }

  function mergeEvents(events) {
    let added = false;
    for (const e of events) {
      if (!state.events.has(e.id)) { state.events.set(e.id, e); added = true; }
    }
    if (state.events.size > MAX_EVENTS * 2) {
      const keep = Array.from(state.events.keys()).sort((a, b) => b - a).slice(0, MAX_EVENTS);
      const kept = new Set(keep);
      for (const id of Array.from(state.events.keys())) if (!kept.has(id)) state.events.delete(id);
    }
    if (added) renderTimeline();
  }

  function eventRow(e) {
    const cat = category(e.kind);
    const li = BP.el("li", { class: "event cat-" + cat, "data-kind": e.kind, "data-event": e.id });
    li.appendChild(BP.el("time", { datetime: e.time }, BP.clock(e.time)));
    li.appendChild(BP.el("span", { class: "kind" }, e.kind.replace(/_/g, " ")));
    li.appendChild(BP.el("span", { class: "node-name" }, e.node || ""));
    li.appendChild(BP.el("span", { class: "reason" }, e.reason));
    const actor = e.actor || "system";
    const userAction = !["balancer", "system"].includes(actor);
    li.appendChild(BP.el("span", { class: "actor" + (userAction ? " user" : "") }, actor));
    if (e.data && Object.keys(e.data).length) {
      // Click (or Enter) for why: what the action changed and what it was decided on.
      const open = state.openEvents.has(e.id);
      li.classList.add("explained");
      li.setAttribute("tabindex", "0");
      li.setAttribute("role", "button");
      li.setAttribute("aria-expanded", String(open));
      const toggle = () => {
        if (state.openEvents.has(e.id)) state.openEvents.delete(e.id); else state.openEvents.add(e.id);
        li.replaceWith(eventRow(e));
      };
      li.addEventListener("click", toggle);
      li.addEventListener("keydown", (ev) => { if (ev.key === "Enter") toggle(); });
      if (open) li.appendChild(why(e.data));
    }
    return li;
  }

  const OBSERVED = [
    ["level", "level", (v) => v.toFixed(2)],
    ["high_water", "high water", (v) => v.toFixed(2)],
    ["low_water", "low water", (v) => v.toFixed(2)],
    ["buffered_bytes", "buffered", (v) => BP.bytes(v)],
    ["in_rate", "in", (v) => BP.rate(v)],
    ["out_rate", "out", (v) => BP.rate(v)],
    ["flagged", "flag", (v) => (v ? "set" : "–")],
    ["rate_coefficient", "rate ×", (v) => v.toFixed(2)],
    ["speed", "speed", (v) => v.toFixed(2)],
  ];

  function why(data) {
    const box = BP.el("div", { class: "why" });
    box.addEventListener("click", (ev) => ev.stopPropagation());  // reading it keeps it open
    const changed = Object.entries(data).filter(([k]) => !["kind", "reason", "observed"].includes(k));
    if (changed.length) {
      box.appendChild(BP.el("h4", {}, "Changed"));
      const dl = BP.el("dl", { class: "changed" });
      for (const [k, v] of changed) {
        dl.appendChild(BP.el("dt", {}, k.replace(/_/g, " ")));
        dl.appendChild(BP.el("dd", {}, typeof v === "object" ? JSON.stringify(v) : String(v)));
      }
      box.appendChild(dl);
    }
    const observed = data.observed || {};
    const nodes = Object.keys(observed);
    if (nodes.length) {
      box.appendChild(BP.el("h4", {}, "Decided on (each node before the decision)"));
      const table = BP.el("table", { class: "observed" });
      const head = BP.el("tr");
      head.appendChild(BP.el("th", {}, "node"));
      for (const [, label] of OBSERVED) head.appendChild(BP.el("th", {}, label));
      table.appendChild(head);
      for (const node of nodes) {
        const row = BP.el("tr", { "data-node": node });
        row.appendChild(BP.el("th", {}, node));
        for (const [key, , show] of OBSERVED) {
          const v = observed[node][key];
          row.appendChild(BP.el("td", { "data-field": key }, v === undefined || v === null ? "–" : show(v)));
        }
        table.appendChild(row);
      }
      box.appendChild(table);
    }
    return box;
  }

  function renderTimeline() {
    const filter = $("event-filter").value;
    const events = Array.from(state.events.values())
      .filter((e) => filter === "all" || category(e.kind) === filter)
      .sort((a, b) => b.id - a.id).slice(0, MAX_EVENTS);
    const list = $("timeline");
    list.replaceChildren(...events.map(eventRow));
    if (!events.length) list.appendChild(BP.el("li", { class: "muted" }, "no events yet"));
    $("event-count").textContent = `${state.events.size} events`;
    if (state.selected) renderNodeEvents(state.selected);
  }

  async function refreshEvents() {
    const r = await BP.api("GET", config.api + "events/?limit=200");
    if (r.ok && Array.isArray(r.data)) mergeEvents(r.data);
  }

  // -- charts -------------------------------------------------------------------------

  let chartsPending = false;
  function scheduleCharts() {
    if (chartsPending) return;
    chartsPending = true;
    setTimeout(() => { chartsPending = false; drawCharts(); }, 400);
  }

  // A run started from the policy lab: its live curve over the lab's prediction for its
  // policy, and the lab's bound (the fastest any policy could finish).
  function completionSeries() {
    const series = [];
    const p = config.prediction;
    if (p) series.push({ points: p.curve, cls: "series-predicted", dashed: true });
    series.push({ points: state.completion, cls: "series-completion" });
    return series;
  }

  function predictionMarks() {
    const p = config.prediction;
    return p ? [{ t: p.bound_s, label: "bound", cls: "mark-bound" }] : [];
  }

  function drawCharts() {
    if (state.unbounded) {
      $("chart-completion-title").textContent = "Oldest data waiting outside the run";
      $("chart-throughput-title").textContent = "Taken in (bytes per second)";
      const oldest = Math.max(5, ...state.completion.map((p) => p[1]));
      BP.lineChart($("chart-completion"), [{ points: state.completion, cls: "series-completion" }], {
        yMax: BP.niceCeil(oldest), yFormat: (v) => v.toFixed(v % 1 ? 1 : 0) + " s" });
    } else {
      BP.lineChart($("chart-completion"), completionSeries(), { yMax: 1,
        yFormat: (v) => Math.round(v * 100) + "%", marks: predictionMarks() });
    }
    const tp = state.throughput;
    const peak = Math.max(256 * 1024, ...tp.map((p) => p[1]));
    const unit = peak >= 1024 * 1024 ? 1024 * 1024 : 1024;
    const unitName = unit === 1024 ? "KB/s" : "MB/s";
    const tick = (v) => { const x = v / unit; return (x % 1 ? x.toFixed(1) : x.toFixed(0)) + " " + unitName; };
    BP.lineChart($("chart-throughput"), [{ points: tp, cls: "series-throughput" }], {
      yMax: BP.niceCeil(peak / unit) * unit, yFormat: tick });
    const headline = state.unbounded
      ? rateOf(state.ingested, HEADLINE_WINDOW_S)
      : throughputOf(state.completion, HEADLINE_WINDOW_S);
    const last = headline[headline.length - 1];
    $("run-throughput").textContent = last ? BP.rate(last[1]) : "–";
    $("run-throughput").title = state.unbounded
      ? `taken in by the source, average of the last ${HEADLINE_WINDOW_S} s`
      : `merged at the sink, average of the last ${HEADLINE_WINDOW_S} s`;
  }

  async function loadCompletion() {
    const r = await BP.api("GET", config.api + "completion/");
    // A continuous run has no completion curve (no input total): its charts are live only.
    if (!r.ok || !r.data || !r.data.points.length || state.unbounded) return;
    const live = state.completion;
    const firstLive = live.length ? live[0][0] : Infinity;
    state.completion = r.data.points.filter((p) => p[0] < firstLive).concat(live);
    state.throughput = throughputOf(state.completion);
    drawCharts();
  }

  // -- results ------------------------------------------------------------------------

  const RESULTS_EVERY_MS = 5000;
  const RESULT_ROWS = 20;

  async function loadResults() {
    // The result as it merges, stamped with where it is exact up to; polled while the
    // run is active (the snapshot carries node states, not result rows).
    const r = await BP.api("GET", `${config.api}results/?limit=${RESULT_ROWS}`);
    if (r.ok && r.data) renderResults(r.data);
    if (!(r.ok && r.data && r.data.final)) setTimeout(loadResults, RESULTS_EVERY_MS);
  }

  function cells(tr, values, tag = "td") {
    for (const value of values) {
      const td = document.createElement(tag);
      td.textContent = String(value);  // text, never markup: keys come from the data
      tr.appendChild(td);
    }
    return tr;
  }

  function span(start, end) {
    // Windows are UTC; the date is dropped when both ends share it.
    const [d1, t1] = start.replace("Z", "").split("T");
    const [d2, t2] = end.replace("Z", "").split("T");
    return d1 === d2 ? `${d1} ${t1}–${t2}` : `${d1} ${t1} – ${d2} ${t2}`;
  }

  function renderWindows(w) {
    const card = $("windows-card");
    if (!card) return;
    card.hidden = !w;
    if (!w) return;
    const slide = w.slide_s !== w.window_s ? `, sliding every ${w.slide_s} s` : "";
    $("windows-stamp").textContent =
      `${w.window_s} s windows on ${w.event_time}${slide}, lateness ${w.lateness_s} s`;
    const lag = typeof w.event_lag_s === "number" ? ` · sink ${w.event_lag_s.toFixed(1)} s behind the source in event time` : "";
    const parts = (w.partitions || []).length
      ? ` · partitions ${w.partitions.map((h, i) => `${i}: ${h || "–"}`).join(", ")}`
      : "";
    $("windows-marks").textContent =
      `watermark ${w.watermark || "–"} · ${w.closed} closed · ${w.late_records} late (quarantined)${lag}${parts}`;
    card.setAttribute("data-late", w.late_records);
    card.setAttribute("data-closed", w.closed);
    const late = $("windows-late-list");
    while (late.firstChild) late.removeChild(late.firstChild);
    for (const line of w.late_sample || []) {
      const li = document.createElement("li");
      li.textContent = line;  // text, never markup: records come from the data
      late.appendChild(li);
    }
    $("windows-late").hidden = !(w.late_sample && w.late_sample.length);
    const open = $("windows-open").querySelector("tbody");
    while (open.firstChild) open.removeChild(open.firstChild);
    for (const o of w.open) {
      open.appendChild(cells(document.createElement("tr"),
        [span(o.start, o.end), o.keys, o.records, BP.pct(o.progress)]));
    }
  }

  function renderResults(data) {
    renderWindows(data.windows);
    const stamp = data.final ? `final: ${data.keys} keys` : `exact up to ${data.exact_up_to} · ${data.keys} keys`;
    $("results-stamp").textContent = data.keys > data.rows.length
      ? `${stamp}, the ${data.rows.length} with the most records` : stamp;
    // The columns are the pipeline's: (each row's window,) its group fields and its
    // measures by their names.
    const head = $("results").querySelector("thead");
    while (head.firstChild) head.removeChild(head.firstChild);
    head.appendChild(cells(document.createElement("tr"), data.columns, "th"));
    const body = $("results").querySelector("tbody");
    while (body.firstChild) body.removeChild(body.firstChild);
    // A column with a fraction anywhere shows two decimals everywhere (79.00 beside
    // 81.40); counts and text as they are.
    const decimal = new Set(data.columns.filter((c) => data.rows.some(
      (row) => typeof row[c] === "number" && !Number.isInteger(row[c]))));
    const shown = (c, v) => v === null || v === undefined ? "–"
      : decimal.has(c) && typeof v === "number" ? v.toFixed(2) : String(v);
    for (const row of data.rows) {
      body.appendChild(cells(document.createElement("tr"), data.columns.map((c) => shown(c, row[c]))));
    }
  }

  // -- start --------------------------------------------------------------------------

  const view = new BP.TopologyView($("topology"), config.topology, { live: true, onSelect: select });

  function init() {
    $("btn-pause").addEventListener("click", () => control("pause"));
    $("btn-resume").addEventListener("click", () => control("resume"));
    $("btn-stop").addEventListener("click", () => control("stop"));
    if ($("btn-cancel")) $("btn-cancel").addEventListener("click", () => control("cancel"));
    $("btn-migrate").addEventListener("click", () => nodeAction(false));
    $("btn-stop-migrating").addEventListener("click", () => nodeAction(true));
    $("btn-hot-migrate").addEventListener("click", () => adjust("hot_migrate"));
    $("btn-add-instance").addEventListener("click", () => adjust("add_instance"));
    $("btn-remove-instance").addEventListener("click", () => adjust("remove_instance"));
    $("event-filter").addEventListener("change", renderTimeline);
    BP.labelLevelBands($("legend"));
    drawCharts();
    refreshEvents();
    loadCompletion();
    loadResults();
    connect();
    // A tab woken from sleep may hold a dead socket: ask for a fresh snapshot.
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden && state.socket && state.socket.readyState === WebSocket.OPEN) {
        state.socket.send(JSON.stringify({ type: "resync" }));
      }
    });
  }

  global.bpConsole = { state, view, select, connect, config };
  init();
})(window);
