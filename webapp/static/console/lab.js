/* The policy lab's page: polls the lab until its simulation is done, then draws every
 * policy's predicted completion curve against the bound, lists them fastest first, and
 * fills the form that starts a live run with the chosen one. Everything from the API's
 * JSON, written as text (policy labels and errors are never markup). */
(function () {
  "use strict";

  const POLL_MS = 1000;
  const config = BP.readJson("lab-config");
  const $ = (id) => document.getElementById(id);
  let chosen = null;

  function render(lab) {
    const status = $("lab-status");
    status.textContent = lab.status;
    status.dataset.status = lab.status;
    status.className = "status status-" + lab.status;
    $("lab-error").hidden = !lab.error;
    $("lab-error").textContent = lab.error;
    renderRuns(lab.runs);
    if (!lab.result) return;
    const arms = lab.result.arms.slice().sort(byCompletion);
    if (chosen === null && arms.length) chosen = arms[0].name;
    $("lab-bound").textContent = "The bound: no policy can finish before "
      + lab.result.bound_s.toFixed(1) + " s (the input through the pipeline's max flow, "
      + "operators' reductions counted).";
    renderTable(lab.result, arms);
    renderForm(arms);
    drawChart(lab.result);
  }

  function byCompletion(a, b) {
    const x = a.completion_s === null ? Infinity : a.completion_s;
    const y = b.completion_s === null ? Infinity : b.completion_s;
    return x - y;
  }

  function colour(result, name) {
    return "series-arm-" + result.arms.findIndex((a) => a.name === name) % 8;
  }

  function renderTable(result, arms) {
    const body = $("lab-arms").tBodies[0];
    body.textContent = "";
    for (const arm of arms) {
      const tr = BP.el("tr", { "data-arm": arm.name, class: arm.name === chosen ? "chosen" : "" });
      const first = BP.el("td");
      const swatch = BP.svg("svg", { class: "swatch-line", viewBox: "0 0 18 6", "aria-hidden": "true" });
      swatch.appendChild(BP.svg("line", { x1: 0, x2: 18, y1: 3, y2: 3, class: "series " + colour(result, arm.name) }));
      first.appendChild(swatch);
      tr.appendChild(first);
      tr.appendChild(BP.el("td", {}, arm.label));
      tr.appendChild(BP.el("td", { class: "completion" },
        arm.completion_s === null ? "did not finish: " + arm.problem : arm.completion_s.toFixed(1) + " s"));
      tr.appendChild(BP.el("td", {}, arm.ratio_to_bound === null ? "–" : arm.ratio_to_bound.toFixed(2) + "x"));
      tr.appendChild(BP.el("td", {}, BP.pct(arm.migrated_share, 1)));
      tr.addEventListener("click", () => choose(arm.name));
      body.appendChild(tr);
    }
  }

  function renderForm(arms) {
    const form = $("lab-start-form");
    if (!form) return;
    const select = $("id_lab_policy");
    if (!select.options.length) {
      for (const arm of arms) {
        const label = arm.completion_s === null ? arm.label
          : `${arm.label} (predicted ${arm.completion_s.toFixed(1)} s)`;
        select.appendChild(BP.el("option", { value: arm.name }, label));
      }
      select.addEventListener("change", () => choose(select.value));
    }
    select.value = chosen;
    form.hidden = false;
  }

  function choose(name) {
    chosen = name;
    render(current);
  }

  function drawChart(result) {
    // The chosen policy drawn last and the others faded, so its curve reads against the bound.
    const series = result.arms.map((arm) => ({
      points: arm.curve,
      cls: colour(result, arm.name) + (arm.name === chosen ? "" : " faded"),
      title: arm.label,
    }));
    series.sort((a, b) => (a.cls.includes("faded") ? 0 : 1) - (b.cls.includes("faded") ? 0 : 1));
    // Drawn wide: the chart spans the page's width, and its text keeps the run page's size.
    BP.lineChart($("lab-chart"), series, {
      yMax: 1, yFormat: (v) => Math.round(v * 100) + "%", minT: 1, width: 1200, height: 300,
      marks: [{ t: result.bound_s, label: "bound", cls: "mark-bound" }],
    });
  }

  function renderRuns(runs) {
    const list = $("lab-runs");
    list.textContent = "";
    if (!runs.length) {
      list.appendChild(BP.el("li", { class: "muted" }, "None yet."));
      return;
    }
    for (const r of runs) {
      const li = BP.el("li");
      li.appendChild(BP.el("a", { href: `/runs/${r.run}/` }, `run ${r.run}`));
      li.appendChild(document.createTextNode(` · ${r.arm} · ${r.status}`));
      list.appendChild(li);
    }
  }

  let current = BP.readJson("lab-view");

  async function poll() {
    const r = await BP.api("GET", config.api);
    if (r.ok && r.data) {
      current = r.data;
      render(current);
    }
    if (!(r.ok && r.data && (r.data.status === "done" || r.data.status === "failed"))) {
      setTimeout(poll, POLL_MS);
    }
  }

  render(current);
  if (current.status !== "done" && current.status !== "failed") setTimeout(poll, POLL_MS);
})();
