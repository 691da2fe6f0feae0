/* The pipeline editor: nodes, links, operator parameters, buffer sizes and bandwidths,
 * kept as one topology document (docs/topology-format.md). Every change is checked by the
 * server's validator (POST /api/pipelines/validate/) and each problem is shown next to
 * the field its location names (nodes[2].buffer_mb, edges[0].to, policy_overrides.x).
 * Saving posts the document; the server validates again and saves nothing when invalid. */
(function (global) {
  "use strict";
  const BP = global.BP;
  const config = BP.readJson("editor-config");
  const doc = JSON.parse(JSON.stringify(config.document || {}));
  doc.nodes = Array.isArray(doc.nodes) ? doc.nodes : [];
  doc.edges = Array.isArray(doc.edges) ? doc.edges : [];
  const KINDS = ["source", "operator", "sink"];
  const DEFAULT_OPERATOR = config.default_operators || {};  // node kind -> operator (the catalog's)
  const $ = (id) => document.getElementById(id);
  let problems = config.problems || [];
  let schemas = {};  // node name -> its output fields, where a declared schema reaches it
  let checkTimer = null;
  let checkSeq = 0;

  // -- values ---------------------------------------------------------------------------

  function numberOrRaw(text) {
    const t = String(text).trim();
    if (t === "") return undefined;
    const n = Number(t);
    return isNaN(n) ? t : n;
  }

  function paramValue(spec, text) {
    const t = String(text);
    if (t.trim() === "") return undefined;
    if (Array.isArray(spec.default) || spec.list) {
      return t.split("\n").map((s) => s.trim()).filter(Boolean);
    }
    if (typeof spec.default === "number" || spec.number) return numberOrRaw(t);
    return t;
  }

  // A source's schema, "key string, value double" (Spark's DDL), edited one field a line.
  function schemaValue(text) {
    const fields = String(text).split("\n").map((s) => s.trim()).filter(Boolean);
    return fields.length ? fields.join(", ") : undefined;
  }

  // An aggregate's measures, {name, fn, field[, percentile | by]}, edited one a line as
  // "name = fn(field)" ("flights = count()", "p95 = approx_percentile(delay, 0.95)",
  // "first_tail = first(tail, dep_time)"); a line of another form is kept as it is, for
  // the check to say what is wrong with it.
  function measuresValue(text) {
    const lines = String(text).split("\n").map((s) => s.trim()).filter(Boolean);
    if (!lines.length) return undefined;
    return lines.map((line) => {
      const m = /^(\w+)\s*=\s*(\w+)\s*\(\s*(\w*)\s*(?:,\s*([\w.]+)\s*)?\)$/.exec(line);
      if (!m) return line;
      const measure = m[3] ? { name: m[1], fn: m[2], field: m[3] } : { name: m[1], fn: m[2] };
      if (m[4] !== undefined && /^[0-9.]+$/.test(m[4])) measure.percentile = Number(m[4]);
      else if (m[4] !== undefined) measure.by = m[4];
      return measure;
    });
  }

  function shownMeasures(value) {
    if (!Array.isArray(value)) return shownParam(value);
    return value.map((m) => m && typeof m === "object"
      ? `${m.name} = ${m.fn}(${m.field || ""}${m.percentile !== undefined ? ", " + m.percentile : ""}${m.by ? ", " + m.by : ""})`
      : String(m)).join("\n");
  }

  function shownSchema(value) {
    return typeof value === "string" ? value.split(",").map((s) => s.trim()).join("\n") : shownParam(value);
  }

  function shownParam(value) {
    if (value === undefined || value === null) return "";
    if (Array.isArray(value)) return value.join("\n");
    if (typeof value === "object") return JSON.stringify(value);
    return String(value);
  }

  function setOrDelete(obj, key, value) {
    if (value === undefined || value === "") delete obj[key];
    else obj[key] = value;
  }

  // -- rendering ------------------------------------------------------------------------

  function input(loc, value, onInput, attrs) {
    const node = BP.el("input", Object.assign({ type: "text", "data-loc": loc }, attrs || {}));
    node.value = value === undefined || value === null ? "" : value;
    node.addEventListener("input", () => { onInput(node.value); changed(); });
    return node;
  }

  function select(loc, options, value, onChange, attrs) {
    const node = BP.el("select", Object.assign({ "data-loc": loc }, attrs || {}));
    const values = options.slice();
    if (value !== undefined && value !== null && !values.some((o) => o[0] === value)) {
      values.push([value, value + " (unknown)"]);
    }
    for (const [v, label] of values) {
      const opt = BP.el("option", { value: v }, label);
      if (v === value) opt.selected = true;
      node.appendChild(opt);
    }
    node.addEventListener("change", () => { onChange(node.value); changed(true); });
    return node;
  }

  function slot(loc) {
    return BP.el("div", { class: "field-error", "data-error-for": loc });
  }

  function cell(...children) {
    const td = BP.el("td");
    for (const c of children) td.appendChild(c);
    return td;
  }

  function renderGeneral() {
    $("f-name").value = doc.name || "";
    $("f-description").value = doc.description || "";
    const policy = $("f-policy");
    policy.replaceChildren(BP.el("option", { value: "" }, "default policy"));
    for (const name of config.policies) {
      const opt = BP.el("option", { value: name }, name);
      if (doc.policy === name) opt.selected = true;
      policy.appendChild(opt);
    }
    policy.disabled = !config.can_change_policy;
    renderOverrides();
    $("policy-hint").textContent = config.can_change_policy
      ? "Overrides change a parameter of the base policy for this pipeline only."
      : "Policies are changed by admins (Django admin); they are kept as they are here.";
  }

  function renderOverrides() {
    const box = $("overrides");
    box.replaceChildren();
    const overrides = doc.policy_overrides || {};
    const table = BP.el("table", { class: "edit" });
    for (const [name, value] of Object.entries(overrides)) {
      const param = config.parameters.find((p) => p.name === name);
      const tr = BP.el("tr", { "data-override": name });
      const label = param ? `${param.label} (${name}) ${param.range}${param.unit ? " " + param.unit : ""}` : name;
      tr.appendChild(cell(BP.el("span", {}, label)));
      const field = input(`policy_overrides.${name}`, value, (v) => {
        doc.policy_overrides[name] = numberOrRaw(v);
      }, { disabled: !config.can_change_policy });
      tr.appendChild(cell(field, slot(`policy_overrides.${name}`)));
      if (config.can_change_policy) {
        tr.appendChild(cell(BP.el("button", { type: "button", class: "secondary", onclick: () => {
          delete doc.policy_overrides[name];
          if (!Object.keys(doc.policy_overrides).length) delete doc.policy_overrides;
          renderOverrides(); changed(true);
        } }, "remove")));
      }
      table.appendChild(tr);
    }
    if (table.children.length) box.appendChild(table);
    else box.appendChild(BP.el("p", { class: "hint" }, "none"));
    if (config.can_change_policy) {
      const add = select("override-new", [["", "+ override a parameter…"]].concat(
        config.parameters.filter((p) => !(p.name in overrides)).map((p) => [p.name, `${p.label} (${p.name})`])),
      "", (name) => {
        if (!name) return;
        doc.policy_overrides = doc.policy_overrides || {};
        doc.policy_overrides[name] = "";
        renderOverrides();
      });
      box.appendChild(add);
    }
  }

  function operatorOptions(kind) {
    return Object.entries(config.operators)
      .filter(([, spec]) => spec.kind === kind)
      .map(([name]) => [name, name]);
  }

  function renderParams(node, i) {
    const box = BP.el("div", { class: "params" });
    const spec = config.operators[node.operator];
    node.params = node.params && typeof node.params === "object" ? node.params : {};
    if (spec) {
      for (const [pname, pspec] of Object.entries(spec.params)) {
        // Another way to say the same (the key form) only where the node says it so.
        if (pspec.alternative && !(pname in node.params)) continue;
        const loc = `nodes[${i}].params.${pname}`;
        const id = `p-${i}-${pname}`;
        box.appendChild(BP.el("label", { for: id, title: pspec.help }, pname + (pspec.required ? " *" : "")));
        const isList = Array.isArray(pspec.default) || pspec.list;
        // Parameters edited one item a line, in a form of their own.
        const lined = {
          schema: [shownSchema, schemaValue, "key string\nvalue double (one field a line)"],
          measures: [shownMeasures, measuresValue, "flights = count()\nmean_delay = avg(dep_delay) (one a line)"],
        }[pname];
        if (lined) {
          const [shown, parsed, placeholder] = lined;
          const field = BP.el("textarea", { id, rows: 3, "data-loc": loc, placeholder });
          field.value = shown(node.params[pname]);
          field.addEventListener("input", () => { setOrDelete(node.params, pname, parsed(field.value)); changed(); });
          const wrap = BP.el("div");
          wrap.appendChild(field);
          wrap.appendChild(slot(loc));
          if (pname === "schema") wrap.appendChild(sampler(node, field, i));
          box.appendChild(wrap);
          continue;
        }
        const placeholder = pspec.default === null || pspec.default === undefined ? pspec.help : shownParam(pspec.default).replace(/\n/g, ", ");
        let field;
        if (pspec.lines) {
          field = BP.el("textarea", { id, rows: 4, "data-loc": loc, placeholder });
          field.value = shownParam(node.params[pname]);
          field.addEventListener("input", () => { setOrDelete(node.params, pname, field.value.trim() ? field.value : undefined); changed(); });
        } else if (isList) {
          field = BP.el("textarea", { id, rows: 2, "data-loc": loc, placeholder: placeholder + " (one per line)" });
          field.value = shownParam(node.params[pname]);
          field.addEventListener("input", () => {
            setOrDelete(node.params, pname, paramValue({ list: true, default: [] }, field.value));
            changed();
          });
        } else {
          field = input(loc, shownParam(node.params[pname]), (v) => setOrDelete(node.params, pname, paramValue(pspec, v)),
            { id, placeholder });
        }
        const wrap = BP.el("div");
        wrap.appendChild(field);
        wrap.appendChild(slot(loc));
        box.appendChild(wrap);
      }
    }
    const extra = Object.keys(node.params).filter((k) => !spec || !(k in spec.params));
    for (const name of extra) {
      box.appendChild(BP.el("label", {}, name + " (unknown)"));
      box.appendChild(BP.el("button", { type: "button", class: "secondary", onclick: () => {
        delete node.params[name]; renderNodes(); changed(true);
      } }, "remove " + name));
    }
    return box;
  }

  // Proposes a source's schema from the first records of an input file (the operator
  // confirms it: it only fills the field).
  function sampler(node, field, i) {
    const path = BP.el("input", { type: "text", id: `sample-${i}`, "aria-label": "sample file",
      placeholder: "a file below the input folders", size: 24 });
    const said = BP.el("div", { class: "schema muted", "data-sample-for": `nodes[${i}]` });
    const button = BP.el("button", { type: "button", class: "secondary", onclick: async () => {
      said.textContent = "reading…";
      const r = await BP.api("POST", config.sample_url, { path: path.value, format: (node.params || {}).format || "jsonl" });
      if (!r.ok || !r.data) { said.textContent = (r.data && r.data.detail) || `could not read it (HTTP ${r.status})`; return; }
      field.value = shownSchema(r.data.schema);
      setOrDelete(node.params, "schema", r.data.schema || undefined);
      const left = r.data.nested.length ? `; left out (nested): ${r.data.nested.join(", ")}` : "";
      said.textContent = `from ${r.data.records} records of ${r.data.file}${left}: check the types, then save`;
      changed(true);
    } }, "Propose from a file");
    const box = BP.el("div", { class: "sampler" });
    box.append(path, button, said);
    return box;
  }

  function renderNodes() {
    const body = $("nodes-table").querySelector("tbody");
    body.replaceChildren();
    doc.nodes.forEach((node, i) => {
      const at = `nodes[${i}]`;
      const tr = BP.el("tr", { "data-row": at });
      const name = input(`${at}.name`, node.name, (v) => { node.name = v; }, { "aria-label": "node name" });
      let before = node.name;
      name.addEventListener("change", () => {
        for (const e of doc.edges) {
          if (e.from === before) e.from = node.name;
          if (e.to === before) e.to = node.name;
        }
        before = node.name;
        renderEdges(); changed(true);
      });
      tr.appendChild(cell(name, slot(`${at}.name`), slot(at)));
      tr.appendChild(cell(select(`${at}.kind`, KINDS.map((k) => [k, k]), node.kind, (v) => {
        node.kind = v;
        node.operator = DEFAULT_OPERATOR[v];
        node.params = {};
        renderNodes();
      }), slot(`${at}.kind`)));
      tr.appendChild(cell(input(`${at}.stage`, node.stage, (v) => setOrDelete(node, "stage", v.trim()),
        { placeholder: "own name", "aria-label": "stage" }), slot(`${at}.stage`)));
      const op = select(`${at}.operator`, operatorOptions(node.kind), node.operator, (v) => {
        node.operator = v; node.params = {}; renderNodes();
      });
      tr.appendChild(cell(op, slot(`${at}.operator`), renderParams(node, i), slot(`${at}.params`),
        BP.el("div", { class: "schema muted", "data-schema-for": at })));
      tr.appendChild(cell(input(`${at}.buffer_mb`, node.buffer_mb, (v) => setOrDelete(node, "buffer_mb", numberOrRaw(v)),
        { placeholder: "64", inputmode: "decimal", size: 6, "aria-label": "buffer MB" }), slot(`${at}.buffer_mb`)));
      tr.appendChild(cell(input(`${at}.max_rate_mbps`, node.max_rate_mbps, (v) => setOrDelete(node, "max_rate_mbps", numberOrRaw(v)),
        { placeholder: "0", inputmode: "decimal", size: 6, "aria-label": "max rate" }), slot(`${at}.max_rate_mbps`)));
      tr.appendChild(cell(BP.el("button", { type: "button", class: "secondary", title: "remove this node and its links",
        "data-remove-node": node.name || i, onclick: () => {
          doc.edges = doc.edges.filter((e) => e.from !== node.name && e.to !== node.name);
          doc.nodes.splice(i, 1);
          renderNodes(); renderEdges(); changed(true);
        } }, "✕")));
      body.appendChild(tr);
    });
  }

  function renderEdges() {
    const body = $("edges-table").querySelector("tbody");
    body.replaceChildren();
    const names = doc.nodes.map((n) => n.name).filter(Boolean).map((n) => [n, n]);
    doc.edges.forEach((edge, i) => {
      const at = `edges[${i}]`;
      const tr = BP.el("tr", { "data-row": at });
      tr.appendChild(cell(select(`${at}.from`, [["", "–"]].concat(names), edge.from, (v) => { edge.from = v; }), slot(`${at}.from`), slot(at)));
      tr.appendChild(cell(select(`${at}.to`, [["", "–"]].concat(names), edge.to, (v) => { edge.to = v; }), slot(`${at}.to`)));
      tr.appendChild(cell(input(`${at}.bandwidth_mbps`, edge.bandwidth_mbps, (v) => setOrDelete(edge, "bandwidth_mbps", numberOrRaw(v)),
        { placeholder: "0", inputmode: "decimal", "aria-label": "bandwidth" }), slot(`${at}.bandwidth_mbps`)));
      tr.appendChild(cell(BP.el("button", { type: "button", class: "secondary", onclick: () => {
        doc.edges.splice(i, 1); renderEdges(); changed(true);
      } }, "✕")));
      body.appendChild(tr);
    });
  }

  function renderPreview() {
    BP.drawStatic($("editor-preview"), doc);
  }

  // -- problems -------------------------------------------------------------------------

  function slotFor(location, message) {
    const find = (key) => document.querySelector(`[data-error-for="${key.replace(/"/g, '\\"')}"]`);
    let m = location.match(/^nodes\[(\d+)\](?: \([^)]*\))?\.params\.(\w+)$/);
    if (m) {
      const key = `nodes[${m[1]}].params.${m[2]}`;
      return find(key) ? key : `nodes[${m[1]}].params`;
    }
    m = location.match(/^nodes\[(\d+)\](?: \([^)]*\))?(?:\.(\w+))?$/);
    if (m) {
      const at = `nodes[${m[1]}]`;
      if (m[2] === "params") {
        const p = message.match(/^parameter '([^']+)'/);
        if (p && find(`${at}.params.${p[1]}`)) return `${at}.params.${p[1]}`;
        if (/^(unknown operator|operator ')/.test(message)) return `${at}.operator`;
      }
      const key = m[2] ? `${at}.${m[2]}` : at;
      return find(key) ? key : at;
    }
    m = location.match(/^edges\[(\d+)\](?:\.(\w+))?$/);
    if (m) {
      const key = m[2] ? `edges[${m[1]}].${m[2]}` : `edges[${m[1]}]`;
      return find(key) ? key : `edges[${m[1]}]`;
    }
    m = location.match(/^node (.+)$/);
    if (m) {
      const i = doc.nodes.findIndex((n) => n.name === m[1]);
      if (i >= 0) return `nodes[${i}]`;
    }
    m = location.match(/^policy_overrides\.(\w+)$/);
    if (m) return find(location) ? location : "policy_overrides";
    if (["name", "description", "policy", "nodes", "edges", "policy_overrides"].includes(location)) return location;
    return null;
  }

  function showSchemas() {
    doc.nodes.forEach((node, i) => {
      const box = document.querySelector(`[data-schema-for="nodes[${i}]"]`);
      if (!box) return;
      const fields = schemas[node.name];
      box.textContent = fields && fields.length
        ? "writes " + fields.map((f) => `${f.name} ${f.type}`).join(", ")
        : "";
    });
  }

  function showProblems() {
    for (const node of document.querySelectorAll(".field-error")) node.replaceChildren();
    for (const node of document.querySelectorAll(".has-error")) node.classList.remove("has-error");
    for (const node of document.querySelectorAll("tr.row-error")) node.classList.remove("row-error");
    const general = [];
    for (const p of problems) {
      const key = slotFor(p.location, p.message);
      const target = key && document.querySelector(`[data-error-for="${key}"]`);
      if (!target) { general.push(p); continue; }
      target.appendChild(BP.el("div", { "data-problem": p.location }, p.message));
      const field = document.querySelector(`[data-loc="${key}"]`);
      if (field) field.classList.add("has-error");
      const row = target.closest("tr[data-row]");
      if (row) row.classList.add("row-error");
    }
    const box = $("general-problems");
    box.replaceChildren();
    box.hidden = general.length === 0;
    if (general.length) {
      box.appendChild(BP.el("strong", {}, "Problems with the pipeline as a whole:"));
      const ul = BP.el("ul");
      for (const p of general) ul.appendChild(BP.el("li", { "data-problem": p.location }, `${p.location}: ${p.message}`));
      box.appendChild(ul);
    }
    const state = $("check-state");
    state.textContent = problems.length ? `${problems.length} problem(s): not saved until fixed` : "no problems";
    state.className = "check-state " + (problems.length ? "error" : "muted");
    state.setAttribute("data-problems", problems.length);
  }

  function cleaned() {
    const out = JSON.parse(JSON.stringify(doc));
    if (!out.description) delete out.description;
    if (!out.policy) delete out.policy;
    if (out.policy_overrides && !Object.keys(out.policy_overrides).length) delete out.policy_overrides;
    for (const n of out.nodes) {
      if (!n.stage) delete n.stage;
      if (n.params && !Object.keys(n.params).length && n.kind !== "source") delete n.params;
    }
    return out;
  }

  async function check() {
    const seq = ++checkSeq;
    $("check-state").textContent = "checking…";
    const r = await BP.api("POST", config.validate_url, cleaned());
    if (seq !== checkSeq) return;  // a newer check is on its way
    if (!r.ok || !r.data) { $("check-state").textContent = `could not check (HTTP ${r.status})`; return; }
    problems = r.data.problems;
    schemas = r.data.schemas || {};
    showProblems();
    showSchemas();
  }

  function changed(now) {
    renderPreview();
    clearTimeout(checkTimer);
    checkTimer = setTimeout(check, now ? 0 : 350);
  }

  // -- start ----------------------------------------------------------------------------

  function init() {
    $("f-name").addEventListener("input", (ev) => { doc.name = ev.target.value.trim(); changed(); });
    $("f-description").addEventListener("input", (ev) => { doc.description = ev.target.value; changed(); });
    $("f-policy").addEventListener("change", (ev) => { setOrDelete(doc, "policy", ev.target.value); changed(true); });
    $("add-node").addEventListener("click", () => {
      let n = doc.nodes.length + 1;
      while (doc.nodes.some((x) => x.name === "node" + n)) n++;
      doc.nodes.push({ name: "node" + n, kind: "operator", operator: DEFAULT_OPERATOR.operator, params: {}, buffer_mb: 64 });
      renderNodes(); renderEdges(); changed(true);
    });
    $("add-edge").addEventListener("click", () => {
      doc.edges.push({ from: "", to: "" });
      renderEdges(); changed(true);
    });
    $("check").addEventListener("click", check);
    $("editor-form").addEventListener("submit", () => {
      $("id_document").value = JSON.stringify(cleaned());
    });
    renderGeneral();
    renderNodes();
    renderEdges();
    renderPreview();
    showProblems();
    if (!problems.length) $("check-state").textContent = "";
    if (doc.nodes.length) check();  // the fields each node writes, from the server
  }

  global.bpEditor = { doc, check, problems: () => problems };
  init();
})(window);
