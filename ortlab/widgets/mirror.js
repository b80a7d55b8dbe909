// The Lab's widgets drawn from the JSON nodes ortlab.widgets.mirror sends (an anywidget module: no CDN, no build
// step). A node is {id, kind, description, disabled, tooltip, layout, classes, children, ...its kind's traits}. What
// a person does is sent back as {event, id, value}; Python sets it on the real widget and answers with nodes.

const CSS = `
.ortlab-m { font-family: var(--jp-ui-font-family, system-ui, sans-serif); font-size: 13px; line-height: 1.4;
  color: var(--jp-ui-font-color1, #222); max-width: 100%; }
.ortlab-m .m-vbox { display: flex; flex-direction: column; gap: 2px; min-width: 0; }
.ortlab-m .m-hbox, .ortlab-m .m-box { display: flex; flex-flow: row wrap; align-items: center; gap: 4px; min-width: 0; }
.ortlab-m .m-tabbar { display: flex; flex-wrap: wrap; border-bottom: 1px solid #bbb; margin-bottom: 4px; }
.ortlab-m .m-tabbar button { border: 1px solid #ccc; border-bottom: none; background: #eee; padding: 3px 10px;
  margin-right: 1px; cursor: pointer; font-size: 13px; }
.ortlab-m .m-tabbar button.m-on { background: #fff; font-weight: 600; border-top: 2px solid #1976d2; }
.ortlab-m button.m-button { padding: 3px 10px; border: 1px solid #bbb; border-radius: 2px; background: #eee;
  cursor: pointer; font-size: 13px; min-height: 26px; }
.ortlab-m button.m-button:disabled { opacity: 0.5; cursor: default; }
.ortlab-m button.m-primary, .ortlab-m .m-toggles button.m-on { background: #1976d2; color: #fff; border-color: #1976d2; }
.ortlab-m button.m-success { background: #388e3c; color: #fff; } .ortlab-m button.m-info { background: #0097a7; color: #fff; }
.ortlab-m button.m-warning { background: #f57c00; color: #fff; } .ortlab-m button.m-danger { background: #d32f2f; color: #fff; }
.ortlab-m .m-field { display: inline-flex; align-items: center; gap: 4px; max-width: 100%; min-width: 0; }
.ortlab-m .m-field > span.m-desc { color: #444; white-space: nowrap; }
.ortlab-m input[type=number] { width: 90px; } .ortlab-m select { max-width: 100%; }
.ortlab-m img { max-width: 100%; height: auto; }
.ortlab-m details > summary { cursor: pointer; padding: 3px 0; font-weight: 600; }
.ortlab-m .m-html pre { white-space: pre-wrap; overflow-wrap: anywhere; }
`;

const ICONS = { play: "\u25B6 ", stop: "\u25A0 ", download: "\u2193 " };

function applyLayout(el, node) {
  const layout = node.layout || {};
  const css = { width: "width", max_width: "maxWidth", min_width: "minWidth", flex: "flex", margin: "margin",
                flex_flow: "flexFlow", align_items: "alignItems" };
  for (const [key, prop] of Object.entries(css)) el.style[prop] = layout[key] || "";
  el.style.display = layout.display === "none" ? "none" : "";
  if (node.tooltip) el.title = node.tooltip;
  for (const c of node.classes || []) el.classList.add(c);
}

function field(node, input) {
  const wrap = document.createElement("label");
  wrap.className = "m-field";
  if (node.description) {
    const desc = document.createElement("span");
    desc.className = "m-desc";
    desc.textContent = node.description;
    wrap.appendChild(desc);
  }
  wrap.appendChild(input);
  return wrap;
}

export function createRenderer(model, el) {
  const nodes = { ...(model.get("nodes") || {}) };
  const elements = new Map(); // id -> element drawn
  const send = (event, id, value) => model.send({ event, id, value });

  function build(id) {
    const node = nodes[id];
    let el;
    if (!node) {
      el = document.createElement("div");
      el.textContent = "(missing widget)";
    } else if (node.kind === "tab") {
      el = document.createElement("div");
      el.className = "m-tab";
      const bar = document.createElement("div");
      bar.className = "m-tabbar";
      const body = document.createElement("div");
      const children = node.children || [];
      let selected = node.selected_index ?? 0;
      const show = () => {
        [...bar.children].forEach((b, i) => b.classList.toggle("m-on", i === selected));
        body.replaceChildren(children[selected] !== undefined ? element(children[selected]) : "");
      };
      children.forEach((child, i) => {
        const b = document.createElement("button");
        b.textContent = (node.titles || [])[i] || `tab ${i + 1}`;
        b.className = "m-tabbutton";
        b.onclick = () => { selected = i; show(); send("selected", id, i); };
        bar.appendChild(b);
      });
      el.append(bar, body);
      show();
    } else if (node.kind === "accordion") {
      el = document.createElement("div");
      (node.children || []).forEach((child, i) => {
        const d = document.createElement("details");
        const s = document.createElement("summary");
        s.textContent = (node.titles || [])[i] || `section ${i + 1}`;
        d.open = node.selected_index === i;
        d.append(s, element(child));
        el.appendChild(d);
      });
    } else if (["vbox", "hbox", "box"].includes(node.kind)) {
      el = document.createElement("div");
      el.className = `m-${node.kind}`;
      for (const child of node.children || []) el.appendChild(element(child));
    } else if (node.kind === "html" || node.kind === "label") {
      el = document.createElement("div");
      el.className = `m-${node.kind}`;
      const content = document.createElement(node.kind === "html" ? "div" : "span");
      if (node.kind === "html") content.innerHTML = node.value || ""; else content.textContent = node.value || "";
      el.appendChild(node.description ? field(node, content) : content);
    } else if (node.kind === "button") {
      el = document.createElement("button");
      el.className = `m-button m-${node.button_style || "default"}`;
      el.textContent = (ICONS[node.icon] || "") + (node.description || "");
      el.disabled = !!node.disabled;
      el.onclick = () => send("click", id);
    } else if (node.kind === "toggles") {
      const group = document.createElement("div");
      group.className = "m-toggles m-hbox";
      (node.labels || []).forEach((label, i) => {
        const b = document.createElement("button");
        b.className = "m-button" + (i === node.index ? " m-on" : "");
        b.textContent = label;
        b.disabled = !!node.disabled;
        b.onclick = () => send("index", id, i);
        group.appendChild(b);
      });
      el = field(node, group);
    } else if (node.kind === "dropdown" || node.kind === "select") {
      const select = document.createElement("select");
      if (node.kind === "select") select.size = node.rows || 5;
      (node.labels || []).forEach((label, i) => {
        const option = document.createElement("option");
        option.value = String(i);
        option.textContent = label;
        select.appendChild(option);
      });
      select.selectedIndex = node.index ?? -1;
      select.disabled = !!node.disabled;
      select.onchange = () => send("index", id, select.selectedIndex < 0 ? null : select.selectedIndex);
      el = field(node, select);
    } else if (node.kind === "checkbox") {
      const box = document.createElement("input");
      box.type = "checkbox";
      box.checked = !!node.value;
      box.disabled = !!node.disabled;
      box.onchange = () => send("value", id, box.checked);
      el = document.createElement("label");
      el.className = "m-field m-checkbox";
      el.append(box, document.createTextNode(node.description || ""));
    } else if (node.kind === "number" || node.kind === "text") {
      const input = document.createElement("input");
      input.type = node.kind === "number" ? "number" : "text";
      if (node.kind === "number") input.step = node.integer ? "1" : "any";
      if (node.placeholder) input.placeholder = node.placeholder;
      input.value = node.value ?? "";
      input.disabled = !!node.disabled;
      input.onchange = () => send("value", id, node.kind === "number" ? Number(input.value) : input.value);
      el = field(node, input);
    } else if (node.kind === "slider" || node.kind === "logslider") {
      const input = document.createElement("input");
      const readout = document.createElement("span");
      const log = node.kind === "logslider";
      input.type = "range";
      input.min = node.min; input.max = node.max; input.step = node.step || 1;
      input.value = log ? Math.log(node.value) / Math.log(node.base || 10) : node.value;
      input.disabled = !!node.disabled;
      const value = () => (log ? Math.pow(node.base || 10, Number(input.value)) : Number(input.value));
      readout.textContent = log ? value().toExponential(1) : String(node.value);
      input.oninput = () => { readout.textContent = log ? value().toExponential(1) : input.value; };
      input.onchange = () => send("value", id, value());
      const both = document.createElement("span");
      both.append(input, readout);
      el = field(node, both);
    } else if (node.kind === "progress") {
      const bar = document.createElement("progress");
      bar.max = Math.max(1, (node.max ?? 100) - (node.min ?? 0));
      bar.value = (node.value ?? 0) - (node.min ?? 0);
      el = field(node, bar);
    } else if (node.kind === "image") {
      el = document.createElement("img");
      if (node.value) el.src = `data:image/${node.format || "png"};base64,${node.value}`;
      else el.style.display = "none";
    } else {
      el = document.createElement("div");
      el.textContent = `(${node.name || node.kind})`;
    }
    el.dataset.mirror = id;
    if (node) applyLayout(el, node);
    if (node && node.kind === "image" && !node.value) el.style.display = "none";
    return el;
  }

  function element(id) {
    if (!elements.has(id)) elements.set(id, build(id));
    return elements.get(id);
  }

  function update(changed) {
    Object.assign(nodes, changed);
    for (const id of Object.keys(changed)) {
      const old = elements.get(id);
      if (!old) continue;
      const active = el.getRootNode().activeElement; // the document's, or the shadow root's in marimo
      if (active && old.contains(active) && ["number", "text"].includes(nodes[id].kind)) {
        const input = old.querySelector("input");
        if (input) input.disabled = !!nodes[id].disabled; // the person is typing: their text stays
        continue;
      }
      elements.delete(id);
      const fresh = element(id);
      if (old.parentNode) old.parentNode.replaceChild(fresh, old);
    }
  }

  const root = document.createElement("div");
  root.className = "ortlab-m";
  const style = document.createElement("style");
  style.textContent = CSS;
  root.append(style, element(model.get("root")));
  el.appendChild(root);
  const onMessage = (msg) => { if (msg && msg.type === "nodes") update(msg.nodes || {}); };
  model.on("msg:custom", onMessage);
  return () => model.off("msg:custom", onMessage);
}

export default {
  render({ model, el }) {
    return createRenderer(model, el);
  },
};
