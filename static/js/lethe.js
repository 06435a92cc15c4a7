// Lethe's small amount of JavaScript. Every flow also works without it.
(function () {
  "use strict";

  // Language switch: submit on change (the button is there for no-JS).
  document.addEventListener("change", function (event) {
    var select = event.target.closest("select[data-autosubmit]");
    if (select) select.form.submit();
  });

  // ---- Shared Save/Discard bar -------------------------------------------------
  // Each form[data-contributor] is an independent contributor: it saves to its own
  // endpoint, and a failure in one leaves the others saved.
  var bar = document.getElementById("save-bar");
  if (!bar) return;
  var saved = {};

  function forms() {
    return Array.prototype.slice.call(document.querySelectorAll("form[data-contributor]"));
  }
  function snapshot(form) {
    var data = new FormData(form);
    data.delete("csrfmiddlewaretoken");
    data.delete("revision");
    return new URLSearchParams(data).toString();
  }
  function dirtyForms() {
    return forms().filter(function (f) { return snapshot(f) !== saved[f.dataset.contributor]; });
  }
  function refresh(message) {
    var dirty = dirtyForms();
    bar.hidden = dirty.length === 0 && !message;
    bar.querySelector(".save-bar-status").textContent = message || bar.getAttribute("aria-label");
    bar.querySelector(".save-bar-which").textContent = dirty.map(function (f) { return f.dataset.label; }).join(" · ");
    bar.querySelectorAll("button").forEach(function (b) { b.disabled = dirty.length === 0; });
    document.body.classList.toggle("has-save-bar", !bar.hidden);
  }
  function restore(form, query) {
    var params = new URLSearchParams(query);
    Array.prototype.forEach.call(form.elements, function (el) {
      if (!el.name || el.name === "csrfmiddlewaretoken" || el.name === "revision") return;
      if (el.type === "checkbox" || el.type === "radio") {
        el.checked = params.getAll(el.name).indexOf(el.value || "on") !== -1;
      } else {
        el.value = params.has(el.name) ? params.get(el.name) : "";
      }
      el.removeAttribute("aria-invalid");
    });
    form.querySelectorAll(".field-error, .alert-error").forEach(function (n) { n.remove(); });
  }
  function remember(form) { saved[form.dataset.contributor] = snapshot(form); }

  function saveOne(form) {
    var card = form.closest("section") || form;
    var key = form.dataset.contributor;
    return fetch(form.action, {
      method: "POST",
      body: new FormData(form),
      headers: { "HX-Request": "true" },
      credentials: "same-origin",
    }).then(function (response) {
      return response.text().then(function (html) {
        var holder = document.createElement("div");
        holder.innerHTML = html.trim();
        var fresh = holder.firstElementChild;
        if (fresh) {
          card.replaceWith(fresh);
          if (window.htmx) window.htmx.process(fresh);
        }
        var newForm = document.querySelector('form[data-contributor="' + key + '"]');
        if (response.ok && newForm) remember(newForm);
        if (!response.ok && fresh) fresh.classList.add("has-error");
        return response.ok;
      });
    }).catch(function () { return false; });
  }

  function saveAll() {
    var dirty = dirtyForms();
    bar.classList.add("is-busy");
    return Promise.all(dirty.map(saveOne)).then(function (results) {
      bar.classList.remove("is-busy");
      var failed = results.indexOf(false) !== -1;
      refresh(failed ? bar.dataset.failed : "");
      if (failed) {
        // Take the person to what needs fixing.
        var card = document.querySelector(".card.has-error");
        var field = card && (card.querySelector("[aria-invalid=true]") || card.querySelector("input, select"));
        if (card) card.scrollIntoView({ block: "center" });
        if (field) field.focus({ preventScroll: true });
      }
    });
  }

  forms().forEach(remember);
  document.addEventListener("input", function () { refresh(); });
  document.addEventListener("change", function () { refresh(); });
  document.addEventListener("submit", function (event) {
    if (event.target.matches("form[data-contributor]")) {
      event.preventDefault();
      saveAll();
    }
  });
  bar.addEventListener("click", function (event) {
    var action = event.target.closest("[data-save-bar]");
    if (!action) return;
    if (action.dataset.saveBar === "save") {
      saveAll();
    } else {
      dirtyForms().forEach(function (f) { restore(f, saved[f.dataset.contributor]); });
      refresh();
    }
  });
  window.addEventListener("beforeunload", function (event) {
    if (dirtyForms().length) {
      event.preventDefault();
      event.returnValue = bar.dataset.leaveWarning;
      return bar.dataset.leaveWarning;
    }
  });
  refresh();
})();
