/* A pipeline drawn as a layered DAG in SVG, left to right (sources first).
 *
 * layout(): layers by longest path from a source, order inside a layer by a few
 * barycenter sweeps (fewer crossings), then coordinates.
 * TopologyView: draws nodes and links once, then update(snapshot) only changes
 * attributes and texts (no re-layout on a tick), which keeps a tick's DOM work small.
 * Only when a hot migration or rescale changes the set of nodes or links is the
 * graph laid out and drawn again.
 */
(function (global) {
  "use strict";
  const BP = global.BP;

  function layout(nodeNames, edges, size) {
    const down = new Map(nodeNames.map((n) => [n, []]));
    const up = new Map(nodeNames.map((n) => [n, []]));
    for (const e of edges) {
      if (!down.has(e.from) || !down.has(e.to) || e.from === e.to) continue;
      down.get(e.from).push(e.to);
      up.get(e.to).push(e.from);
    }
    // Longest path layering in topological order (Kahn); nodes on a cycle go last.
    const indegree = new Map(nodeNames.map((n) => [n, up.get(n).length]));
    const queue = nodeNames.filter((n) => indegree.get(n) === 0);
    const layer = new Map(nodeNames.map((n) => [n, 0]));
    const seen = new Set();
    while (queue.length) {
      const n = queue.shift();
      seen.add(n);
      for (const m of down.get(n)) {
        layer.set(m, Math.max(layer.get(m), layer.get(n) + 1));
        indegree.set(m, indegree.get(m) - 1);
        if (indegree.get(m) === 0) queue.push(m);
      }
    }
    let maxLayer = Math.max(0, ...Array.from(layer.values()));
    for (const n of nodeNames) if (!seen.has(n)) layer.set(n, ++maxLayer);
    const layers = [];
    for (const n of nodeNames) {
      const l = layer.get(n);
      (layers[l] = layers[l] || []).push(n);
    }
    for (let i = 0; i < layers.length; i++) layers[i] = layers[i] || [];
    // Barycenter sweeps: down using upstream positions, up using downstream positions.
    const pos = new Map();
    const index = () => layers.forEach((ns) => ns.forEach((n, i) => pos.set(n, i)));
    index();
    const bary = (n, neighbours) => {
      const ps = neighbours.get(n).map((m) => pos.get(m)).filter((p) => p !== undefined);
      return ps.length ? ps.reduce((a, b) => a + b, 0) / ps.length : pos.get(n);
    };
    for (let sweep = 0; sweep < 4; sweep++) {
      const range = sweep % 2 === 0 ? layers.slice(1) : layers.slice(0, -1).reverse();
      for (const ns of range) {
        const keyed = ns.map((n) => [bary(n, sweep % 2 === 0 ? up : down), pos.get(n), n]);
        keyed.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
        ns.splice(0, ns.length, ...keyed.map((k) => k[2]));
        ns.forEach((n, i) => pos.set(n, i));
      }
    }
    const maxCount = Math.max(1, ...layers.map((ns) => ns.length));
    const colH = maxCount * size.h + (maxCount - 1) * size.gapY;
    const points = {};
    layers.forEach((ns, l) => {
      const h = ns.length * size.h + (ns.length - 1) * size.gapY;
      ns.forEach((n, i) => {
        points[n] = {
          x: size.pad + l * (size.w + size.gapX),
          y: size.padTop + (colH - h) / 2 + i * (size.h + size.gapY),
          layer: l,
        };
      });
    });
    return {
      points: points,
      width: size.pad * 2 + layers.length * size.w + Math.max(0, layers.length - 1) * size.gapX,
      height: size.padTop + size.pad + colH,
    };
  }

  const LIVE = { w: 196, h: 104, gapX: 118, gapY: 26, pad: 16, padTop: 16 };
  const STATIC = { w: 160, h: 62, gapX: 90, gapY: 18, pad: 12, padTop: 12 };
  const BAR = { x: 10, y: 40, w: 176, h: 16 };

  function linkPath(a, b, size) {
    const x1 = a.x + size.w, y1 = a.y + size.h / 2;
    const x2 = b.x, y2 = b.y + size.h / 2;
    const dx = Math.max(40, (x2 - x1) / 2);
    return { d: `M${x1},${y1} C${x1 + dx},${y1} ${x2 - dx},${y2} ${x2},${y2}`,
             mid: { x: (x1 + x2) / 2, y: (y1 + y2) / 2 }, x1, y1, x2, y2, dx };
  }

  function pointOnLink(p, t) {
    // The cubic Bezier of linkPath at t: its control points share the ends' heights.
    const u = 1 - t;
    const x = u * u * u * p.x1 + 3 * u * u * t * (p.x1 + p.dx) + 3 * u * t * t * (p.x2 - p.dx) + t * t * t * p.x2;
    const y = (u * u * u + 3 * u * u * t) * p.y1 + (3 * u * t * t + t * t * t) * p.y2;
    return { x, y };
  }

  function shapeOf(names, edges) {
    // What the drawing's layout depends on: the node names and the links between them.
    const known = new Set(names);
    const links = edges.filter((e) => known.has(e.from) && known.has(e.to)).map((e) => e.from + ">" + e.to);
    return [...names].sort().join("|") + "#" + links.sort().join("|");
  }

  // "14 s", "3 min", "over an hour": how soon a pool reaches its high water.
  function soon(seconds) {
    if (seconds < 60) return `${Math.max(1, Math.round(seconds))} s`;
    if (seconds < 3600) return `${Math.round(seconds / 60)} min`;
    return "over an hour";
  }

  class TopologyView {
    constructor(svgElement, topology, options) {
      this.svg = svgElement;
      this.options = Object.assign({ live: false, onSelect: null }, options || {});
      this.size = this.options.live ? LIVE : STATIC;
      this.selected = null;
      this.draw(topology);
    }

    draw(topology) {
      const svg = this.svg;
      while (svg.firstChild) svg.removeChild(svg.firstChild);
      this.topology = topology;
      const names = topology.nodes.map((n) => n.name);
      const edges = topology.edges.filter((e) => names.includes(e.from) && names.includes(e.to));
      this.shape = shapeOf(names, edges);
      this.geometry = layout(names, edges, this.size);
      const { width, height, points } = this.geometry;
      svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
      // Scale up to fill a wide card a little, never so much that text gets oversized.
      svg.style.maxWidth = Math.round(width * (this.options.live ? 1.3 : 1.15)) + "px";
      svg.setAttribute("data-width", width);
      svg.setAttribute("data-height", height);
      svg.classList.add("topology");
      const defs = BP.svg("defs");
      for (const [id, cls] of [["arrow", "arrowhead"], ["arrow-migration", "arrowhead migration"]]) {
        const marker = BP.svg("marker", { id: id + this.uid(), viewBox: "0 0 10 10", refX: "9",
          refY: "5", markerWidth: "10", markerHeight: "10", markerUnits: "userSpaceOnUse",
          orient: "auto-start-reverse" });
        marker.appendChild(BP.svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: cls }));
        defs.appendChild(marker);
      }
      svg.appendChild(defs);
      this.linkLayer = svg.appendChild(BP.svg("g", { class: "links" }));
      this.migrationLayer = svg.appendChild(BP.svg("g", { class: "migrations" }));
      this.nodeLayer = svg.appendChild(BP.svg("g", { class: "nodes" }));
      this.labelLayer = svg.appendChild(BP.svg("g", { class: "link-labels" }));
      this.markerLayer = svg.appendChild(BP.svg("g", { class: "adjust-markers" }));
      this.links = new Map();
      for (const e of edges) this.drawLink(e, points);
      this.nodes = new Map();
      for (const n of topology.nodes) this.drawNode(n, points[n.name]);
      const selected = this.nodes.get(this.selected);
      if (selected) selected.g.classList.add("selected");
    }

    uid() {
      if (!this._uid) this._uid = "-" + Math.random().toString(36).slice(2, 8);
      return this._uid;
    }

    drawLink(e, points) {
      const p = linkPath(points[e.from], points[e.to], this.size);
      const key = e.from + ">" + e.to;
      const path = BP.svg("path", { d: p.d, class: "link", "data-link": key,
        "marker-end": `url(#arrow${this.uid()})` });
      this.linkLayer.appendChild(path);
      const label = BP.svg("text", { x: p.mid.x, y: p.mid.y - 6, class: "link-label",
        "text-anchor": "middle", "data-link-label": key });
      const bw = Number(e.bandwidth_mbps || 0);
      label.textContent = bw ? bw + " Mb/s" : "";
      const halo = label.cloneNode(true);
      halo.setAttribute("class", "link-label halo");
      this.labelLayer.appendChild(halo);
      this.labelLayer.appendChild(label);
      this.links.set(key, { edge: e, path, label, halo, geometry: p });
    }

    drawNode(n, at) {
      const s = this.size;
      const g = BP.svg("g", { class: `node kind-${n.kind}`, "data-node": n.name,
        transform: `translate(${at.x},${at.y})`, tabindex: "0", role: "button",
        "aria-label": `node ${n.name}` });
      g.appendChild(BP.svg("rect", { class: "frame", width: s.w, height: s.h, rx: 8 }));
      g.appendChild(BP.svg("text", { class: "title", x: 10, y: this.options.live ? 19 : 21 }, n.name));
      const sub = n.kind === "operator" ? (n.stage && n.stage !== n.name ? `stage ${n.stage}` : "operator") : n.kind;
      const subText = n.operator ? `${sub} · ${n.operator}` : sub;
      const subLine = g.appendChild(BP.svg("text", { class: "sub", x: 10, y: this.options.live ? 33 : 38 }, subText));
      if (!this.options.live && n.kind !== "source") {
        const parts = [];
        const buffer = Number(n.buffer_mb === undefined ? 64 : n.buffer_mb);
        if (!isNaN(buffer)) parts.push(`buffer ${buffer} MB`);
        if (Number(n.max_rate_mbps) > 0) parts.push(`max ${n.max_rate_mbps} Mb/s`);
        g.appendChild(BP.svg("text", { class: "sub", x: 10, y: 53 }, parts.join(" · ")));
      }
      const node = { g, name: n.name, kind: n.kind, sub: subLine, subText };
      if (this.options.live) {
        node.flag = BP.svg("g", { class: "flag", transform: `translate(${s.w - 72},6)` });
        node.flag.appendChild(BP.svg("rect", { width: 64, height: 18, rx: 9 }));
        node.flag.appendChild(BP.svg("text", { x: 32, y: 13, "text-anchor": "middle" }, "⚑ flagged"));
        g.appendChild(node.flag);
        g.appendChild(BP.svg("rect", { class: "bar-bg", x: BAR.x, y: BAR.y, width: BAR.w, height: BAR.h, rx: 3 }));
        node.fill = g.appendChild(BP.svg("rect", { class: "bar-fill level-none", x: BAR.x, y: BAR.y,
          width: 0, height: BAR.h, rx: 3 }));
        node.low = g.appendChild(BP.svg("line", { class: "mark low", y1: BAR.y - 4, y2: BAR.y + BAR.h + 4 }));
        node.high = g.appendChild(BP.svg("line", { class: "mark high", y1: BAR.y - 4, y2: BAR.y + BAR.h + 4 }));
        node.levelText = g.appendChild(BP.svg("text", { class: "level-text", x: BAR.x + 5, y: BAR.y + 12 }, "–"));
        node.line1 = g.appendChild(BP.svg("text", { class: "detail", x: 10, y: 74 }, ""));
        node.line2 = g.appendChild(BP.svg("text", { class: "detail", x: 10, y: 92 }, ""));
        g.addEventListener("click", () => this.select(n.name));
        g.addEventListener("keydown", (ev) => {
          if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); this.select(n.name); }
        });
      }
      this.nodeLayer.appendChild(g);
      this.nodes.set(n.name, node);
    }

    select(name) {
      this.selected = name;
      for (const [n, node] of this.nodes) node.g.classList.toggle("selected", n === name);
      if (this.options.onSelect) this.options.onSelect(name);
    }

    update(snapshot, rates) {
      this.reshape(snapshot);
      this.source = snapshot.source || null;
      this.windows = snapshot.windows || null;
      const byName = new Map((snapshot.nodes || []).map((n) => [n.name, n]));
      for (const [name, node] of this.nodes) {
        const view = byName.get(name);
        if (view) this.updateNode(node, view, rates && rates.get(name));
      }
      for (const link of snapshot.links || []) {
        const drawn = this.links.get(link.source + ">" + link.target);
        if (drawn) this.updateLink(drawn, link);
      }
      this.drawMigrations(snapshot.links || []);
      this.drawMarkers(snapshot.adjustment);
    }

    reshape(snapshot) {
      // Instances join and leave mid-run: lay the graph out again when its shape changed.
      const nodes = (snapshot.nodes || []).map((n) => ({ name: n.name, kind: n.kind, stage: n.stage }));
      if (!nodes.length) return;
      const edges = (snapshot.links || []).map((l) => ({ from: l.source, to: l.target, bandwidth_mbps: l.bandwidth_mbps }));
      if (shapeOf(nodes.map((n) => n.name), edges) !== this.shape) this.draw({ nodes, edges });
    }

    updateNode(node, view, smoothed) {
      const st = view.state || {};
      const level = typeof st.level === "number" ? Math.max(0, Math.min(1, st.level)) : null;
      const cls = BP.levelClass(level);
      node.fill.setAttribute("width", level === null ? 0 : (BAR.w * level).toFixed(1));
      node.fill.setAttribute("class", "bar-fill " + cls);
      node.g.setAttribute("data-level-class", cls);
      const mark = (line, x) => {
        if (typeof x !== "number") { line.setAttribute("visibility", "hidden"); return; }
        const px = (BAR.x + BAR.w * x).toFixed(1);
        line.setAttribute("x1", px); line.setAttribute("x2", px);
        line.setAttribute("visibility", "visible");
      };
      mark(node.high, st.high_water);
      mark(node.low, st.low_water);
      const capacity = view.capacity_bytes;
      // A pool filling towards its high water says when it gets there, in place of
      // its bytes (balancer/forecast.py); nothing when it is draining or already there.
      const fullIn = typeof st.full_in_s === "number" && st.full_in_s > 0 ? st.full_in_s : null;
      // A windowed run: how far behind the source this node is in event time, by the
      // oldest data in its pool; shown in place of the bytes (and of the time to full:
      // in a windowed run, event time is what its results wait for).
      const time = this.windows && this.windows.nodes ? this.windows.nodes[view.name] : null;
      const lag = time && typeof time.lag_s === "number" ? time.lag_s : null;
      const behind = lag !== null && lag >= 0.05 && node.kind !== "source"
        ? `${lag < 10 ? lag.toFixed(1) : Math.round(lag)} s behind` : null;
      const detail = behind || (fullIn === null ? BP.bytes(st.buffered_bytes) : `full in ${soon(fullIn)}`);
      node.levelText.textContent = level === null ? (behind || "no data yet") : `${BP.pct(level)} · ${detail}`;
      node.g.setAttribute("data-full-in", fullIn === null ? "" : fullIn.toFixed(1));
      node.g.setAttribute("data-event-lag", lag === null ? "" : lag.toFixed(1));
      node.g.setAttribute("data-capacity", capacity);
      node.levelText.setAttribute("class", "level-text on-" + cls);
      node.g.setAttribute("data-level", level === null ? "" : level.toFixed(4));
      const flagged = !!st.flagged;
      node.g.classList.toggle("flagged", flagged);
      const instance = view.instance || {};
      const status = instance.status || "active";
      node.g.classList.toggle("joining", status === "joining");
      node.g.classList.toggle("retiring", status === "retiring" || status === "retired");
      node.g.classList.toggle("aligning", !!instance.aligning);
      node.g.setAttribute("data-instance", status);
      node.g.setAttribute("data-worker", instance.worker || "");
      // Where an operator's batches run and how busy that kept it (measured).
      const where = node.kind === "operator" && instance.worker ? ` · ${instance.worker.split("@")[0]}` : "";
      const busy = node.kind === "operator" && typeof st.busy === "number" ? ` · busy ${BP.pct(st.busy)}` : "";
      node.g.setAttribute("data-busy", typeof st.busy === "number" ? st.busy.toFixed(3) : "");
      node.g.setAttribute("data-measured-capacity", typeof st.capacity_bps === "number" ? st.capacity_bps.toFixed(0) : "");
      node.sub.textContent = node.subText + where + busy + (status === "active" ? "" : ` · ${status}`) +
        (instance.aligning ? " · aligning" : "");
      const k = typeof st.rate_coefficient === "number" ? st.rate_coefficient.toFixed(2) : "–";
      const speed = typeof st.speed === "number" ? st.speed.toFixed(2) : "–";
      if (node.kind === "source" && this.source && this.source.unbounded) {
        // A landing folder or a stream: what waits outside the run matters most.
        node.line1.textContent = `k ${k} · speed ${speed}` + (st.in_backpressure ? " · backpressure" : "");
        node.line2.textContent = BP.lagText(this.source);
        node.g.setAttribute("data-lag", node.line2.textContent);
      } else if (node.kind === "source") {
        node.line1.textContent = `rate coefficient k ${k}`;
        node.line2.textContent = `speed ${speed}` + (st.in_backpressure ? " · in backpressure" : "");
      } else {
        const r = smoothed || { in: st.in_rate, out: st.out_rate };
        node.line1.textContent = `in ${BP.rate(r.in)} · out ${BP.rate(r.out)}`;
        node.line2.textContent = `k ${k} · H ${BP.pct(st.high_water)} · W ${BP.pct(st.low_water)}`;
      }
    }

    updateLink(drawn, link) {
      const share = typeof link.share === "number" ? link.share : null;
      const width = share === null ? 2 : 1.5 + 7 * share;
      drawn.path.setAttribute("stroke-width", width.toFixed(2));
      const migratingOut = link.migrating && !link.migrated_from;
      const migratingIn = !!link.migrated_from;
      drawn.path.classList.toggle("migrating-in", migratingIn);
      drawn.path.classList.toggle("migrating-out", migratingOut);
      drawn.path.classList.toggle("closing", !!link.closing);
      const bw = Number(link.bandwidth_mbps || 0);
      const parts = [];
      if (bw) parts.push(bw + " Mb/s");
      if (share !== null) parts.push(BP.pct(share));
      drawn.label.textContent = parts.join(" · ");
      drawn.halo.textContent = drawn.label.textContent;
      drawn.label.classList.toggle("migrating", migratingOut);
    }

    drawMigrations(links) {
      const layer = this.migrationLayer;
      while (layer.firstChild) layer.removeChild(layer.firstChild);
      const points = this.geometry.points;
      for (const link of links) {
        if (!link.migrated_from) continue;
        const heavy = this.links.get(link.source + ">" + link.migrated_from);
        const light = points[link.target];
        if (!heavy || !light) continue;
        // From the heavy link (data meant for the heavy branch) to the light node.
        const s = this.size;
        const from = heavy.geometry.mid;
        const to = { x: light.x, y: light.y + s.h / 2 };
        const bend = Math.max(30, Math.abs(to.y - from.y) / 3);
        const d = `M${from.x},${from.y} C${from.x + bend},${from.y} ${to.x - bend},${to.y} ${to.x - 2},${to.y}`;
        const path = BP.svg("path", { d, class: "migration-path",
          "data-migration": `${link.migrated_from}>${link.target}`,
          "marker-end": `url(#arrow-migration${this.uid()})` });
        const title = BP.svg("title", {}, `data of ${link.migrated_from} migrating to ${link.target}`);
        path.appendChild(title);
        layer.appendChild(path);
      }
    }

    drawMarkers(adjustment) {
      const layer = this.markerLayer;
      while (layer.firstChild) layer.removeChild(layer.firstChild);
      const drawn = new Set();
      for (const m of (adjustment && adjustment.markers) || []) {
        const key = m.from + ">" + m.to;
        const link = this.links.get(key);
        if (!link || drawn.has(key)) continue;
        drawn.add(key);
        // A third of the way along: the link's label sits at its middle.
        const at = pointOnLink(link.geometry, 0.33);
        const glyph = BP.svg("circle", { class: "adjust-marker", "data-link": key,
          cx: at.x.toFixed(1), cy: at.y.toFixed(1), r: 6 });
        glyph.appendChild(BP.svg("title", {}, `adjustment ${adjustment.version}'s marker on its way from ${m.from} to ${m.to}`));
        layer.appendChild(glyph);
      }
    }
  }

  function drawStatic(svgElement, document) {
    const nodes = (document.nodes || []).filter((n) => n && typeof n.name === "string" && n.name);
    const edges = (document.edges || []).filter((e) => e && e.from && e.to);
    return new TopologyView(svgElement, { nodes, edges }, { live: false });
  }

  global.BP = Object.assign(global.BP || {}, { layout, TopologyView, drawStatic });

  document.addEventListener("DOMContentLoaded", () => {
    for (const node of document.querySelectorAll("svg[data-topology]")) {
      const doc = BP.readJson(node.getAttribute("data-topology"));
      if (doc) drawStatic(node, doc);
    }
  });
})(window);
