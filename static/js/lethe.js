// Lethe's small amount of JavaScript. Every flow also works without it.
(function () {
  "use strict";

  function cookie(name) {
    var found = document.cookie.split("; ").filter(function (c) { return c.indexOf(name + "=") === 0; })[0];
    return found ? found.slice(name.length + 1) : null;
  }

  // Says one short thing through a polite live region, then clears it again, so the
  // message is heard once and does not linger for someone reading the page later.
  // A second thing said within the tick replaces the first (the last state is the true one).
  var clearTimers = new WeakMap();
  var writeTimers = new WeakMap();
  function announce(region, text) {
    if (!region) return;
    region.textContent = "";
    clearTimeout(clearTimers.get(region));
    clearTimeout(writeTimers.get(region));
    // A fresh text node after a tick, so saying the same words twice is heard twice.
    writeTimers.set(region, setTimeout(function () { region.textContent = text; }, 50));
    clearTimers.set(region, setTimeout(function () { region.textContent = ""; }, 6000));
  }

  // Focus an element that is not a control (a heading, a card, a loaded output), with its
  // start in view: the browser's own scroll on focus centres a tall element (a long output
  // on a phone opened thousands of pixels past its first line).
  function focusQuiet(el) {
    if (!el) return;
    if (!el.hasAttribute("tabindex")) el.setAttribute("tabindex", "-1");
    el.focus({ preventScroll: true });
    var box = el.getBoundingClientRect();
    var room = window.innerHeight || document.documentElement.clientHeight;
    // Its first lines must show above the phone's fixed bottom bar too: on a short screen (the
    // on-screen keyboard open) a fifth of the height is less than the bar (r66).
    var shown = room - bottomClearance() - Math.min(box.height, 88);
    if (box.top < barClearance() || box.top > Math.min(room * 0.8, shown)) el.scrollIntoView({ block: "start" });
  }
  // How far down the page's sticky top bar reaches, and how far up a fixed bottom bar does:
  // what lies under them is hidden (the page's scroll-padding, which scrollIntoView keeps clear).
  function barClearance() {
    return parseFloat(getComputedStyle(document.documentElement).scrollPaddingTop) || 0;
  }
  function bottomClearance() {
    return parseFloat(getComputedStyle(document.documentElement).scrollPaddingBottom) || 0;
  }
  function focusLost() {
    return !document.activeElement || document.activeElement === document.body;
  }
  // Give a control back the focus after a swap, with it in view between the sticky top bar and
  // the fixed bottom bar: the swap can move the page (scroll anchoring on a short screen), and a
  // focus without a scroll left Retry backup 265 px above the screen (r105). The least scroll
  // that does (the page's scroll-padding keeps the bars clear).
  function focusInView(el) {
    el.focus({ preventScroll: true });
    var box = el.getBoundingClientRect();
    var room = window.innerHeight || document.documentElement.clientHeight;
    if (box.top < barClearance() || box.bottom > room - bottomClearance()) el.scrollIntoView({ block: "nearest" });
  }

  // ---- After an action: its outcome --------------------------------------------
  // A form posted from a list row or a page (Archive, Close...) comes back with a message:
  // the focus starts at it (and it is read out), just before the page's content, rather
  // than at the top of the page.
  var flash = document.querySelector(".flash");
  if (flash && focusLost()) focusQuiet(flash);

  // ---- A form that must go once: form[data-submit-once] ---------------------------
  // Its first submit goes; until the page is left, another (a second tap while the first
  // answer is on its way) is dropped and the submit buttons are disabled. The server still
  // refuses a form sent twice (its one-time number), and says what the first one made.
  (function submitOnce() {
    document.addEventListener("submit", function (event) {
      var form = event.target;
      if (!form.matches || !form.matches("form[data-submit-once]") || event.defaultPrevented) return;
      if (form.dataset.sending === "true") {
        event.preventDefault();
        return;
      }
      form.dataset.sending = "true";
      form.setAttribute("aria-busy", "true");
      // After the browser has taken the form's data (a disabled button is not sent).
      setTimeout(function () {
        form.querySelectorAll("button[type=submit], button:not([type])").forEach(function (b) { b.disabled = true; });
      }, 0);
    });
    // Back to a page the browser kept as it was: its form is usable again (a send of the
    // same one-time number is then answered by the server, which makes nothing twice).
    window.addEventListener("pageshow", function (event) {
      if (!event.persisted) return;
      document.querySelectorAll("form[data-submit-once][data-sending]").forEach(function (form) {
        delete form.dataset.sending;
        form.removeAttribute("aria-busy");
        form.querySelectorAll("button[type=submit], button:not([type])").forEach(function (b) { b.disabled = false; });
      });
    });
  })();

  // ---- A delete's status page: a new state in a few words ---------------------
  // The status card is replaced when it changes (its receipt can run to many lines); the
  // live region beside it says only the state and the step, e.g. "Completed" or
  // "Pending. Erasing: Event log. Step 3 of 21 done."
  // A bound delete waiting on the engine is said as what it waits on ("Pending. Waiting on:
  // the engine"), not with its next retry's time: the card is replaced at every retry, and
  // the same words are not said again while only that time moved.
  function statusWords() {
    var card = document.getElementById("op-status");
    if (!card) return null;
    var parts = [];
    var badge = card.querySelector("h2");
    if (badge) parts.push(badge.textContent.trim());
    var step = card.querySelector("[data-testid=op-step]") || card.querySelector("[data-testid=op-waiting] strong");
    if (step) parts.push(step.textContent.replace(/\s+/g, " ").trim());
    // No longer retried by itself, or retried again (r147: neither was said)
    var stalled = card.querySelector("[data-testid=op-stalled]");
    if (stalled) parts.push(stalled.textContent.replace(/\s+/g, " ").trim());
    return parts.join(". ");
  }
  var statusSaid = statusWords();
  var statusFocus = null;
  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail.target;
    // (every read, a 204 too: what a read found is not left for a later swap, r148)
    if (target && target.id === "op-live") {
      statusFocus = target.contains(document.activeElement) ? { id: document.activeElement.id } : null;
    }
  });
  document.addEventListener("htmx:afterSwap", function (event) {
    if (!event.detail.target || event.detail.target.id !== "op-live") return;
    // The card held the focus (Retry now): the same control if it is still there, else the
    // card (r147: the focus fell to the page, and the next Tab left it)
    var wanted = statusFocus;
    statusFocus = null;
    if (wanted && focusLost()) {
      var el = (wanted.id && document.getElementById(wanted.id)) || document.getElementById("op-status");
      if (el) {
        if (!el.matches("a[href], button, input, select, summary") && !el.hasAttribute("tabindex")) el.setAttribute("tabindex", "-1");
        focusInView(el);
      }
    }
    var words = statusWords();
    if (words === null || words === statusSaid) return;
    statusSaid = words;
    announce(document.getElementById("op-announce"), words);
  });

  // ---- Pages that show something in progress: their poller ------------------------
  // The conversation page, the conversation list and the Operations list poll while they show
  // a pending delete (or a queued or running cleanup): each read answers 204 when nothing
  // changed, else the changed rows out of band and the next poller (none once nothing is in
  // progress). What changed is said once, in the poller's few words (data-said); a row that
  // held the focus gives it back to the same control (by id), else to the row, without
  // scrolling. A read that fails keeps what is shown and says so, until a read succeeds.
  var liveFocus = null;
  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    var target = event.detail.target;
    var fresh = event.detail.fragment && event.detail.fragment.firstElementChild;
    if (!target || !target.matches) return;
    if (target.matches("[data-live-poll]")) {
      var said = fresh && fresh.getAttribute("data-said");
      if (said) announce(document.getElementById("live-announce"), said);
    } else if (target.matches("[data-live-row]") && target.contains(document.activeElement)) {
      // and, should the row leave the list (a finished delete's), the rows beside it
      var near = [target.nextElementSibling, target.previousElementSibling].filter(function (row) {
        return row && row.id;
      }).map(function (row) { return row.id; });
      liveFocus = { id: document.activeElement.id, row: target.id, near: near };
      // A row taken off (swapped with nothing) has no after-swap event that reaches the page.
      if (!fresh) setTimeout(liveFocusBack, 0);
    }
  });
  document.addEventListener("htmx:oobAfterSwap", liveFocusBack);
  function liveFocusBack() {
    var wanted = liveFocus;
    liveFocus = null;
    if (!wanted || !focusLost()) return;
    var el = (wanted.id && document.getElementById(wanted.id)) || document.getElementById(wanted.row);
    // The row left (r136: the focus fell to the page's start): the row beside it, else the heading.
    for (var i = 0; !el && i < wanted.near.length; i++) el = document.getElementById(wanted.near[i]);
    el = el || document.querySelector("main h1");
    if (!el) return;
    if (!el.matches("a[href], button, input, select, summary") && !el.hasAttribute("tabindex")) el.setAttribute("tabindex", "-1");
    el.focus({ preventScroll: true });
    // What came in above it can push it under the sticky bar or off the screen: bring it back
    // into view, the least scroll that does (the page's scroll-padding keeps the bar clear).
    var box = el.getBoundingClientRect();
    var room = window.innerHeight || document.documentElement.clientHeight;
    if (box.top < barClearance() || box.bottom > room) el.scrollIntoView({ block: "nearest" });
  }
  function livePoll(event) {
    var elt = event.detail && event.detail.elt;
    return elt && elt.matches && elt.matches("[data-live-poll]");
  }
  function liveUnavailable(show) {
    var note = document.getElementById("live-unavailable");
    if (!note) return;
    if (!show) {
      if (note.firstChild) note.innerHTML = "";
      return;
    }
    if (note.firstChild) return;  // said once, not again at every failed read
    var p = document.createElement("p");
    p.className = "alert alert-error";
    p.textContent = note.dataset.unavailable || "";
    note.appendChild(p);
  }
  ["htmx:sendError", "htmx:timeout", "htmx:responseError"].forEach(function (name) {
    document.addEventListener(name, function (event) { if (livePoll(event)) liveUnavailable(true); });
  });
  document.addEventListener("htmx:afterRequest", function (event) {
    if (livePoll(event) && event.detail.successful) liveUnavailable(false);
  });

  // ---- The viewer's time zone -------------------------------------------------
  // The server shows times in the zone the browser reports (unless the person chose one).
  try {
    var zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
    if (zone && /^[A-Za-z0-9_+\-/]{1,64}$/.test(zone) && cookie("lethe_browser_timezone") !== zone) {
      document.cookie = "lethe_browser_timezone=" + zone + "; path=/; max-age=31536000; samesite=lax" +
        (location.protocol === "https:" ? "; secure" : "");
    }
  } catch (e) { /* no Intl: times stay in the server's zone, and say which */ }

  // ---- Language and time zone selects -----------------------------------------
  // A pointer or touch choice applies at once. Arrow keys change a closed select's value
  // as they move, so a keyboard change waits for an explicit Enter or the Change button.
  var keyed = null;
  document.addEventListener("keydown", function (event) {
    var select = event.target.closest && event.target.closest("select[data-autosubmit]");
    if (!select) return;
    if (event.key === "Enter" && select.dataset.pending === "true") {
      event.preventDefault();
      refocusAfterReload(select);
      backToAddress(select.form);
      select.form.submit();
      return;
    }
    keyed = select;
  }, true);
  document.addEventListener("pointerdown", function () { keyed = null; }, true);
  // A keyboard user who changed the language gets the focus back on the same control after
  // the page reloads in the new language (it would start at the top of the page).
  function refocusAfterReload(control) {
    try { sessionStorage.setItem("lethe-refocus", control.id); } catch (e) { /* storage off */ }
  }
  // The switch goes back to the page as the address bar names it now: the list's search and
  // tab change the address without a reload (htmx), after the form's `next` was rendered.
  // The server still takes only a path on this site.
  function backToAddress(form) {
    var next = form.querySelector("input[name=next]");
    if (next) next.value = location.pathname + location.search;
  }
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.matches || !form.matches(".language-switch")) return;
    backToAddress(form);
    if (form.contains(document.activeElement)) {
      refocusAfterReload(form.querySelector("select") || document.activeElement);
    }
  });
  (function () {
    var id = null;
    try { id = sessionStorage.getItem("lethe-refocus"); sessionStorage.removeItem("lethe-refocus"); } catch (e) { /* storage off */ }
    var again = id && document.getElementById(id);
    if (again && focusLost()) again.focus();
  })();
  document.addEventListener("change", function (event) {
    var select = event.target.closest && event.target.closest("select[data-autosubmit]");
    if (!select) return;
    if (keyed === select) {
      select.dataset.pending = "true";
      var button = select.form.querySelector("button[type=submit]");
      if (button) button.classList.remove("js-hide");
      return;
    }
    backToAddress(select.form);
    select.form.submit();
  });

  // ---- Conversation list and transcript: focus and announcements after htmx swaps ----
  document.addEventListener("htmx:afterSettle", function (event) {
    var fresh = event.target;
    var config = event.detail && event.detail.requestConfig;
    var trigger = config && config.elt;
    if (fresh.id === "results") {
      var status = document.getElementById("results-status");
      var count = fresh.querySelector("#results-count");
      if (trigger && trigger.hasAttribute && trigger.hasAttribute("data-pager")) {
        // Paging replaced the link that had the focus: move to the top of the new page.
        focusQuiet(count);
        var pageOf = fresh.querySelector(".page-of");
        announce(status, pageOf ? pageOf.textContent.trim() : count.textContent.trim());
      } else if (count) {
        // A search or a tab change: the focus stays in the filters; say the new count.
        announce(status, count.textContent.trim());
      }
      return;
    }
    if (!focusLost()) return;
    // "Show full output" and "Show later messages" replaced the link that had the focus:
    // move to what was loaded.
    if (fresh.classList && fresh.classList.contains("output")) {
      focusQuiet(fresh.querySelector("pre") || fresh);
    } else if (fresh.classList && (fresh.classList.contains("msg") || fresh.classList.contains("alert"))) {
      // a loaded message, or the notice that took the row's place (a conversation being deleted)
      focusQuiet(fresh);
    }
  });

  // ---- Conversation list: search as you type -----------------------------------
  // One list request per query: typing asks 300 ms after the last change (the form's
  // "querysettled" trigger), Enter asks at once (its submit), and a query already asked for
  // is not asked again, so the list is not replaced a second time under a click. Clearing
  // with the box's own clear button is an input like any other.
  var searchTimer = null;
  var searched; // the query the list shows; undefined: the page's own (the box's default value)
  function searchBox(el) {
    return el && el.id === "q" && el.form && el.form.hasAttribute("hx-get") ? el : null;
  }
  document.addEventListener("input", function (event) {
    var box = searchBox(event.target);
    if (!box) return;
    if (searched === undefined) searched = box.defaultValue;
    clearTimeout(searchTimer);
    searchTimer = setTimeout(function () {
      if (box.value === searched) return;
      searched = box.value;
      box.form.dispatchEvent(new CustomEvent("querysettled"));
    }, 300);
  });
  document.addEventListener("submit", function (event) {
    var box = searchBox(event.target.elements && event.target.elements.namedItem("q"));
    if (!box) return;
    clearTimeout(searchTimer);
    if (searched === undefined) searched = box.defaultValue;
    if (box.value === searched) {
      // Enter on the query the list already shows: nothing to ask (this listener runs
      // before the form's own, so htmx never sees the submit).
      event.preventDefault();
      event.stopPropagation();
      return;
    }
    searched = box.value;
  }, true);
  // A tab or an owner picked while the typing has not settled asks once, with the query
  // as typed so far: the typing's own request would only repeat it.
  document.addEventListener("change", function (event) {
    var form = event.target.form;
    var box = form && event.target.id !== "q" && searchBox(form.elements.namedItem("q"));
    if (!box) return;
    clearTimeout(searchTimer);
    searched = box.value;
  }, true);
  // A list request that got no answer (the network, a proxy's 502) or an error answer: the
  // list stays as it was, the error says so, and the next Enter or typing asks again (the
  // query it asked for is not the one shown). A good answer clears the error.
  function listRequest(event) {
    var target = event.detail && event.detail.target;
    return target && target.id === "results";
  }
  function listFailed(event) {
    if (!listRequest(event)) return;
    searched = null; // matches no query: the next one is asked for
    // The tab and the owner go back to the list shown (its address names it), so picking the
    // one that failed again asks again (r133: still picked, it sent no change; the box keeps
    // what was typed, and Enter asks again).
    filtersFromAddress(false);
    var error = document.getElementById("results-error");
    if (error) error.hidden = false;
  }
  // "Find an owner" answers with the Owner list narrowed, the owner it was asked with picked: an
  // answer asked for before another owner was picked is asked for again, with that owner (r133:
  // the list said "All owners" over that owner's conversations).
  var findingFor = null;
  document.addEventListener("htmx:beforeRequest", function (event) {
    var elt = event.detail.elt;
    if (!elt || elt.id !== "owner-find") return;
    var owner = document.getElementById("owner");
    findingFor = owner ? owner.value : null;
  });
  document.addEventListener("htmx:beforeSwap", function (event) {
    var elt = event.detail.requestConfig && event.detail.requestConfig.elt;
    var owner = document.getElementById("owner");
    if (!elt || elt.id !== "owner-find" || !owner || owner.value === findingFor) return;
    event.detail.shouldSwap = false;
    htmx.trigger(elt, "search");
  });
  // One list request at a time: one still on its way when another starts (a page link after a
  // tab, a tab after a page link: each control has its own queue) or when Back or Forward
  // restores a page is given up. Its answer would otherwise land later and write its address
  // over the list shown (r133: the Recent list under ?view=closed, the Closed list under
  // Recent's page 2).
  var listing = null;
  function dropListing() {
    if (listing) {
      listing.abort();
      searched = null; // what it asked for was not shown: the next Enter or typing asks again (r136)
    }
    listing = null;
  }
  document.addEventListener("htmx:beforeRequest", function (event) {
    if (!listRequest(event)) return;
    if (listing !== event.detail.xhr) dropListing();
    listing = event.detail.xhr;
  });
  document.addEventListener("htmx:afterRequest", function (event) {
    if (listing && event.detail && listing === event.detail.xhr) listing = null;
  });
  document.addEventListener("htmx:sendError", listFailed);
  document.addEventListener("htmx:responseError", listFailed);
  document.addEventListener("htmx:afterSwap", function (event) {
    if (!listRequest(event)) return;
    var error = document.getElementById("results-error");
    if (error) error.hidden = true;
  });
  // Back and forward restore a page htmx asks the server for (it keeps no copies: see
  // base.html). Each Back sends its own request and htmx swaps in whichever answer comes,
  // so two quick presses could end on the page before last under the last one's address
  // (the slower answer landing second): an earlier restore still on its way is dropped when
  // another starts, and when the page moves to another address meanwhile (a tab picked).
  var restoring = null;
  function dropRestore() {
    if (restoring) restoring.abort();
    restoring = null;
  }
  document.addEventListener("htmx:historyCacheMiss", function (event) {
    dropRestore();
    dropListing();
    restoring = event.detail.xhr;
  });
  document.addEventListener("htmx:historyCacheMissLoad", function (event) {
    if (restoring === event.detail.xhr) restoring = null;
  });
  document.addEventListener("htmx:historyCacheMissLoadError", function (event) {
    if (restoring === event.detail.xhr) restoring = null;
  });
  document.addEventListener("htmx:beforeRequest", function (event) {
    // Only a request that moves to another address (a live row's poll leaves it be).
    var elt = event.detail.elt;
    var moving = elt && elt.closest && elt.closest("[hx-push-url], [data-hx-push-url]");
    if (moving && (moving.getAttribute("hx-push-url") || moving.getAttribute("data-hx-push-url")) !== "false") dropRestore();
  });
  // The browser may still fill the filters in as they were typed or picked
  // on the page left, so they are set again from the address, which names the list shown:
  // the tab (the first, the server's default, when none is named), the owner, the query.
  document.addEventListener("htmx:historyRestore", function () {
    clearTimeout(searchTimer);
    searched = undefined;
    filtersFromAddress(true);
  });
  // The filters as the address names them; `query`: the search box too.
  function filtersFromAddress(query) {
    var form = document.querySelector("form.filters[hx-push-url]");
    if (!form) return;
    var params = new URLSearchParams(window.location.search);
    var tabs = Array.prototype.slice.call(form.querySelectorAll("input[type=radio][name=view]"));
    var tab = tabs.filter(function (radio) { return radio.value === params.get("view"); })[0] || tabs[0];
    if (tab) tab.checked = true;
    var owner = form.elements.namedItem("owner");
    if (owner) owner.value = params.get("owner") || "";
    if (owner && owner.selectedIndex < 0) owner.value = "";
    var box = form.elements.namedItem("q");
    if (box && query) box.value = box.defaultValue = params.get("q") || "";
  }

  // A full output asked for after the cleanup removed it: the 410 brings the row as it now
  // reads (retargeted to the row by the server), swapped in like any answer.
  document.addEventListener("htmx:beforeSwap", function (event) {
    var elt = event.detail.requestConfig && event.detail.requestConfig.elt;
    if (!elt || !elt.hasAttribute || !elt.hasAttribute("data-gone-swaps") || event.detail.xhr.status !== 410) return;
    event.detail.shouldSwap = true;
    event.detail.isError = false;
  });

  // ---- Data & storage: tool payload cleanup ------------------------------------
  // Status reads and actions answer with out-of-band regions, also on 4xx/5xx (a refusal
  // carries the service's own message), so those bodies are processed, never dropped.
  document.addEventListener("htmx:beforeSwap", function (event) {
    var elt = event.detail.requestConfig && event.detail.requestConfig.elt;
    if (!elt || !elt.closest || !elt.closest("[data-cleanup-action]")) return;
    // Lethe's own answers carry their regions; anything else (a proxy's error page) is
    // said in words instead of being swapped in.
    var ours = (event.detail.xhr.responseText || "").indexOf("hx-swap-oob") !== -1;
    if (event.detail.xhr.status < 400) return;
    event.detail.isError = false;
    event.detail.shouldSwap = ours;
    if (!ours) statusUnreachable({ detail: { elt: elt } });
  });
  // An action whose button left the page while its answer was on the way (another action's
  // answer replaced its region): htmx looks for the answer's regions around the button's old
  // copy, finds none, and its events no longer reach the page. So what this page does with an
  // answer is done here for it: Lethe's regions swapped into the page, anything else (a proxy's
  // page, no answer at all) said as a lost answer (r133: Compact's refusal, answered after
  // Analyze's answer, never showed). Whether the button had left is read as the answer ends,
  // before htmx handles it (r136: an answer that itself replaced the button was swapped twice).
  document.addEventListener("htmx:beforeRequest", function (event) {
    var elt = event.detail.elt;
    var xhr = event.detail.xhr;
    if (!elt || !elt.closest || !elt.closest("[data-cleanup-action]") || !xhr) return;
    var gone = false;
    xhr.addEventListener("readystatechange", function () {
      if (xhr.readyState === 4) gone = !document.body.contains(elt);
    });
    xhr.addEventListener("load", function () {
      if (!gone) return;
      var text = xhr.responseText || "";
      if (text.indexOf("hx-swap-oob") !== -1) htmx.swap(document.body, text, { swapStyle: "none" });
      else if (xhr.status !== 401 && xhr.status !== 403) statusUnreachable({ detail: { elt: elt } });
    });
    // A session ended or a token refused is said beside it as well, and the page stays (r138:
    // htmx followed the answer's redirect to the sign-in page, a draft there or not).
    if (!elt.hasAttribute("data-gone-watch")) {
      elt.setAttribute("data-gone-watch", "");
      elt.addEventListener("htmx:beforeOnLoad", function (loaded) {
        if (!document.body.contains(elt)) signedOutAnswer(loaded);
      });
    }
    function lost() {
      if (gone || !document.body.contains(elt)) statusUnreachable({ detail: { elt: elt } });
    }
    xhr.addEventListener("error", lost);
    xhr.addEventListener("timeout", lost);
  });
  // A status read or action that got no answer of Lethe's: say so, keep what is shown
  // (and keep polling, so the note clears itself on the next good read).
  function statusUnreachable(event) {
    var elt = event.detail && event.detail.elt;
    var note = document.getElementById("tool-status-note");
    if (!note || !elt || !elt.closest) return;
    if (elt.id === "tool-poll") {
      if (note.textContent.trim() === (note.dataset.unavailable || "").trim()) return;  // said once (r147)
      note.innerHTML = "";
      var p = document.createElement("p");
      p.className = "alert alert-error";
      p.textContent = note.dataset.unavailable || "";
      note.appendChild(p);
    } else if (elt.closest("[data-cleanup-action]")) {
      answerLost(elt);
    }
  }
  // The status note is read at every status read (every second while something runs): the same
  // words again are not swapped in, so a screen reader does not say them again (r147: "the job
  // cluster seems to be stopped" eleven times in twelve seconds). The note holds words only.
  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    var target = event.detail.target;
    var fresh = event.detail.fragment;
    if (!target || target.id !== "tool-status-note" || !fresh) return;
    if (fresh.textContent.replace(/\s+/g, " ").trim() === target.textContent.replace(/\s+/g, " ").trim()) {
      event.preventDefault();
    }
  });
  document.addEventListener("htmx:sendError", statusUnreachable);
  document.addEventListener("htmx:timeout", statusUnreachable);

  // An action whose answer did not arrive (the network dropped it, or a proxy answered for
  // Lethe) may have been done all the same: the request can reach Lethe, and Lethe commit,
  // before the answer is lost (r122: "nothing was started" while the run was queued, and it
  // ran). So the status is read again and compared with what the page showed when the button
  // was pressed, by what the button does (its data-effect): "starts K" a new operation of a
  // kind in K made since the press, "cancels" its operation asked to stop (or stopped as
  // cancelled), "turns-off" cleanup off at a newer revision. Until a read succeeds the page
  // says it cannot tell yet, and reads again (the status it reads is swapped in as a poll's).
  var pressed = null; // the last action sent: its button, what the page showed, when
  function historyRows() {
    return Array.prototype.slice.call(document.querySelectorAll("#cleanup-history .history-row[data-op]"));
  }
  function pageFacts() {
    var policy = document.getElementById("tool-saved");
    var newest = {};
    historyRows().forEach(function (row) {
      newest[row.dataset.kind] = Math.max(newest[row.dataset.kind] || 0, Number(row.dataset.op));
    });
    return { newest: newest, revision: policy && policy.dataset.revision, enabled: policy && policy.dataset.enabled };
  }
  document.addEventListener("htmx:beforeRequest", function (event) {
    var elt = cleanupAction(event.detail.elt);
    if (!elt) return;
    var button = elt.matches("[data-effect]") ? elt : elt.querySelector("[data-effect]") || elt;
    pressed = { elt: elt, effect: elt.dataset.effect || button.dataset.effect || "",
                operation: button.value || "", facts: pageFacts(), at: Date.now(),
                // said beside the button pressed, also once the button has left the page
                region: elt.closest("#db-compact") ? "compact-error" : "tool-action-error" };
  });
  // Whether the status now on the page shows the pressed action done: true, false, or null
  // when it cannot tell (the stored state unreadable, the operation no longer listed).
  function pressedDone(press) {
    var policy = document.getElementById("tool-saved");
    if (!policy || !policy.dataset.now) return null;
    var words = press.effect.split(/\s+/);
    if (words[0] === "starts") {
      var kinds = words.slice(1);
      // Made after the press, by the server's clock: an operation another admin started long
      // before, which this page (not polling) never showed, is not this press's.
      var since = Number(policy.dataset.now) - (Date.now() - press.at) / 1000 - 10;
      return historyRows().some(function (row) {
        return kinds.indexOf(row.dataset.kind) !== -1 && Number(row.dataset.op) > (press.facts.newest[row.dataset.kind] || 0) &&
          Number(row.dataset.created) >= since;
      });
    }
    if (words[0] === "cancels") {
      var row = document.querySelector('#cleanup-history .history-row[data-op="' + press.operation + '"]');
      if (!row) return null;
      return row.dataset.cancel === "requested" || row.dataset.state === "cancelled";
    }
    if (words[0] === "turns-off") {
      return policy.dataset.enabled === "false" && policy.dataset.revision !== press.facts.revision;
    }
    return null;
  }
  function answerLost(elt) {
    var press = pressed && pressed.elt === elt ? pressed : null;
    if (!press) press = pressed = { elt: elt, effect: elt.dataset.effect || "", operation: "", facts: pageFacts(), at: Date.now() };
    // Said beside the button pressed: Compact database has its own region.
    var region = document.getElementById(press.region || (elt.closest("#db-compact") ? "compact-error" : "tool-action-error"));
    var live = document.getElementById("cleanup-live");
    var url = live && live.dataset.statusUrl;
    var wait = 2000;
    var said = null;
    function say(key) {  // once each: a read that fails again is not announced again
      if (!region || (said === key && region.firstChild)) return;
      said = key;
      sayAlert(region, region.dataset[key] || "").className = key === "lostDone" ? "alert alert-ok" : "alert alert-error";
    }
    function check() {
      if (pressed !== press) return; // another action was sent since: its answer speaks
      var read = fetch(url, { headers: { "HX-Request": "true" }, credentials: "same-origin" }).then(function (response) {
        if (!response.ok) return null;
        return response.text().then(function (html) { return html.indexOf('id="tool-saved"') !== -1 ? html : null; });
      }).catch(function () { return null; });
      read.then(function (html) {
        if (pressed !== press) return;
        clearTimeout(unsure);
        if (!html) {  // not read either: read again, a little later each time
          say("lostUnknown");
          setTimeout(check, wait);
          wait = Math.min(wait * 2, 30000);
          return;
        }
        if (window.htmx) window.htmx.swap(document.body, html, { swapStyle: "none" });
        var done = pressedDone(press);
        say(done === true ? "lostDone" : done === false ? "lostNotDone" : "lostUnknown");
        if (done === null) setTimeout(check, wait = Math.min(wait * 2, 30000));
      });
    }
    // Said at once only if the read takes a while: a quick one is said once, with its outcome.
    var unsure = setTimeout(function () { if (pressed === press) say("lostUnknown"); }, 1500);
    if (url) check();
    else say("lostUnknown");
  }

  // Each status read replaces the live regions. An unchanged region is left alone; a
  // changed one keeps its open details and the focus (by id), and a new state is said once:
  // the words of its own [data-announce-for] element, when they changed.
  function announcement(region) {
    var el = region.querySelector('[data-announce-for="' + region.id + '"]');
    return el ? el.textContent.replace(/\s+/g, " ").trim() : "";
  }
  var focusAfterSwap = null;
  // The control pressed whose region then lost it (Retry backup gives way to the backup's
  // progress): the focus waits on the region, and goes back to that control when a later read
  // brings it back (the backup failed again), rather than the whole region being read out
  // again beside the live region's words (r19: heard twice). Forgotten once the focus moves on.
  var pressedAway = null;
  document.addEventListener("focusin", function (event) {
    if (pressedAway && event.target.id !== pressedAway.region) pressedAway = null;
  });
  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    var target = event.detail.target;
    var fresh = event.detail.fragment && event.detail.fragment.firstElementChild;
    // (#tool-card: an action that saved the policy, such as Cancel after a failed backup,
    // also replaces the whole card, regions included.)
    if (!target || !fresh || !target.matches || !target.matches(".cleanup-region, #backups, #cleanup-history, #tool-card")) return;
    target.querySelectorAll("details[open][id]").forEach(function (d) {
      var again = fresh.querySelector("#" + d.id);
      if (again) again.setAttribute("open", "");
    });
    if (target.outerHTML === fresh.outerHTML) {
      event.detail.shouldSwap = false;
      return;
    }
    var active = document.activeElement;
    focusAfterSwap = target.contains(active) ? { id: active.id, region: target.id } : null;
    if (focusAfterSwap && pressedAway && active === target && pressedAway.region === target.id &&
        fresh.querySelector("#" + pressedAway.id)) focusAfterSwap.id = pressedAway.id;
    // A card replaced by the action pressed in it starts at that action's confirmation.
    var confirmation = fresh.querySelector('[role=status][data-announce-for="' + fresh.id + '"][id]');
    if (focusAfterSwap && confirmation) focusAfterSwap.id = confirmation.id;
    // Said once: when the focus is to move onto the action's confirmation, moving it reads the
    // confirmation's words, so the live region does not say them too (r19: heard twice).
    var said = announcement(fresh);
    if (said && said !== announcement(target) && !(focusAfterSwap && confirmation)) {
      announce(document.getElementById("cleanup-live"), said);
    }
  });
  document.addEventListener("htmx:oobAfterSwap", function () {
    var wanted = focusAfterSwap;
    focusAfterSwap = null;
    if (!wanted || !focusLost()) return;
    // The same control if it is still there (and usable), else the region it was in.
    var el = wanted.id && document.getElementById(wanted.id);
    if (el && !el.disabled && el.matches("button, a, input, select, summary")) focusInView(el);
    else if (el && el.matches(".cleanup-region, #backups, #cleanup-history, [role=status]")) focusQuiet(el);  // a region that had it, a confirmation
    else {
      focusQuiet(document.getElementById(wanted.region));
      if (wanted.id && !el) pressedAway = { id: wanted.id, region: wanted.region };
    }
  });

  // The backup choice shows when the draft needs it: turning cleanup on (again) or
  // shortening the period. The service decides for sure and refuses a save without it, by the
  // same rule (retention.jobs.may_be_shorter): a period shorter on some day is shorter.
  var spans = {};
  function periodDays(value, unit) {  // [fewest, most] days it counts back, whatever the day
    if (unit === "weeks") return [7 * value, 7 * value];
    if (unit !== "months") return null;
    if (spans[value]) return spans[value];
    var fewest = Infinity, most = 0, first = Date.UTC(2024, 0, 1);
    for (var n = 0; n < 8 * 366; n++) {  // eight years hold every case of month lengths and leap years
      var now = new Date(first + n * 86400000);
      var months = now.getUTCFullYear() * 12 + now.getUTCMonth() - value;
      var year = Math.floor(months / 12), month = months - year * 12;
      var monthEnd = new Date(Date.UTC(year, month + 1, 0)).getUTCDate();
      var days = Math.round((now.getTime() - Date.UTC(year, month, Math.min(now.getUTCDate(), monthEnd))) / 86400000);
      fewest = Math.min(fewest, days);
      most = Math.max(most, days);
    }
    return (spans[value] = [fewest, most]);
  }
  function mayBeShorter(value, unit, thanValue, thanUnit) {
    if (unit === thanUnit) return value < thanValue;
    var draft = periodDays(value, unit), saved = periodDays(thanValue, thanUnit);
    return !!draft && !!saved && draft[0] < saved[1];
  }
  function syncCleanupDraft() {
    var choice = document.getElementById("backup-choice");
    var enabled = document.getElementById("id_enabled");
    var value = document.getElementById("id_age_value");
    var unit = document.getElementById("id_age_unit");
    if (choice && enabled && value && unit) {
      var draft = Number(value.value), saved = Number(choice.dataset.savedAge);
      var shorter = Number.isInteger(draft) && draft > 0 && draft <= 520 &&
        mayBeShorter(draft, unit.value, saved, choice.dataset.savedUnit);
      var needed = enabled.checked && (choice.dataset.savedEnabled !== "true" || shorter);
      var hasError = !!choice.querySelector(".field-error");
      choice.hidden = !(needed || hasError);
      choice.querySelectorAll("input").forEach(function (radio) { radio.disabled = choice.hidden; });
    }
    // An estimate for other settings than the draft's is marked, not hidden.
    var analysis = document.getElementById("tool-analysis");
    var mark = document.getElementById("analysis-draft-stale");
    if (analysis && mark && value && unit) {
      var key = analysis.dataset.ageKey;
      mark.hidden = !key || key === value.value + "-" + unit.value;
    }
  }
  document.addEventListener("input", syncCleanupDraft);
  document.addEventListener("change", syncCleanupDraft);
  document.addEventListener("htmx:afterSettle", syncCleanupDraft);
  document.addEventListener("htmx:oobAfterSwap", syncCleanupDraft);
  syncCleanupDraft();

  // ---- The bars' real heights -----------------------------------------------------
  // The sticky top bar and the phone's bottom bar grow with the reader's text size (r152: at
  // 200% the top bar was 107 px under a fixed 72 px scroll padding, and the bottom bar's tabs
  // wrapped to a second row the page's bottom room did not allow for): the CSS reads their
  // heights from here (--topbar-h, --phonenav-h; its own defaults without a script). A bottom
  // bar hidden meanwhile (a text field focused) keeps its last height, so nothing jumps. A
  // side menu taller than the screen scrolls with the page instead of sticking out of reach.
  // A short visible area (the on-screen keyboard open, a phone held sideways) is marked
  // .is-short: with a text field focused, the top bar then scrolls away (lethe.css).
  var SHORT_BELOW = 480; // visible height, CSS px (the save bar's compact form too)
  function measureBars() {
    var root = document.documentElement;
    var top = document.querySelector(".topbar");
    var nav = document.querySelector(".phonenav");
    var side = document.querySelector(".sidenav");
    if (top && top.offsetHeight) root.style.setProperty("--topbar-h", top.offsetHeight + "px");
    if (nav && nav.offsetHeight) root.style.setProperty("--phonenav-h", nav.offsetHeight + "px");
    if (side && side.offsetHeight) {
      side.classList.toggle("is-tall", side.offsetHeight + (top ? top.offsetHeight : 0) > window.innerHeight);
    }
    var vv = window.visualViewport;
    root.classList.toggle("is-short", (vv ? vv.height : window.innerHeight) < SHORT_BELOW);
  }
  measureBars();
  if (window.ResizeObserver) {
    var barWatch = new ResizeObserver(measureBars);
    [".topbar", ".phonenav", ".sidenav"].forEach(function (s) {
      var el = document.querySelector(s);
      if (el) barWatch.observe(el);
    });
  }
  if (window.visualViewport) window.visualViewport.addEventListener("resize", measureBars);
  window.addEventListener("resize", measureBars);

  // ---- Phone: the field being typed in stays in view ---------------------------
  // When the on-screen keyboard opens the visible area shrinks under a focused field; the
  // bottom navigation steps aside while a text field has focus (lethe.css), and the field is
  // brought back into what is still visible (below the sticky top bar: scroll-padding-top).
  // With the save bar shown, the bar's own placement below keeps the field clear instead.
  var TEXT_INPUT = /^(checkbox|radio|submit|button|reset|hidden|range|file|image|color)$/i;
  function typingField(el) {
    if (!el || !el.matches) return false;
    return el.matches("textarea") || (el.matches("input") && !TEXT_INPUT.test(el.type || ""));
  }
  function typingFieldInView() {
    var el = document.activeElement;
    var saveBar = document.getElementById("save-bar");
    if (!typingField(el) || (saveBar && !saveBar.hidden)) return;
    // A search field goes to the top of what is visible, so its results show under it: with
    // its label (its .field), which the field alone at the top left under the top bar.
    if (el.type === "search") (el.closest(".field") || el).scrollIntoView({ block: "start" });
    else el.scrollIntoView({ block: "nearest" });
  }
  if (window.visualViewport) window.visualViewport.addEventListener("resize", typingFieldInView);
  window.addEventListener("resize", typingFieldInView);

  // ---- Shared Save/Discard bar -------------------------------------------------
  // Each form[data-contributor] is an independent contributor: it saves to its own
  // endpoint, and a failure in one leaves the others saved.
  var bar = document.getElementById("save-bar");
  if (!bar) return;
  var live = document.getElementById("save-bar-live");
  var signIn = bar.querySelector(".save-bar-signin");
  var saved = {};
  var known = new WeakSet(); // the contributor forms whose saved state is recorded
  var lastField = null; // the contributor field the person last used
  var sessionEnded = false;
  // The page's CSRF token went with a session that ended (an action was answered 401): the
  // next save or action fetches a fresh one first, with or without a draft waiting.
  var tokenStale = false;
  var busy = false;

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
    if (dirty.length === 0) sessionEnded = false;
    var wasHidden = bar.hidden;
    bar.hidden = dirty.length === 0 && !message;
    var text = message || (sessionEnded ? bar.dataset.sessionEnded : bar.getAttribute("aria-label"));
    bar.querySelector(".save-bar-status").textContent = text;
    bar.querySelector(".save-bar-short").textContent = shortText(text);
    bar.querySelector(".save-bar-which").textContent = dirty.map(function (f) { return f.dataset.label; }).join(" · ");
    bar.querySelectorAll("button").forEach(function (b) { b.disabled = dirty.length === 0; });
    if (signIn) signIn.hidden = !sessionEnded;
    document.body.classList.toggle("has-save-bar", !bar.hidden);
    placeBar();
    if (wasHidden !== bar.hidden || !bar.hidden) keepFocusClear();
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
      el.removeAttribute("aria-describedby");
    });
    form.querySelectorAll(".field-error, .alert-error").forEach(function (n) { n.remove(); });
    var card = form.closest(".card");
    if (card) card.classList.remove("has-error");
  }
  function remember(form) { saved[form.dataset.contributor] = snapshot(form); }
  // What the server rendered, from the fields' default state: a person who typed before
  // this script ran (a slow phone) still gets the bar for that change. A field the server
  // rendered with an unsaved draft in it (an analysis sent before this script ran) says what is
  // saved in data-saved-value (data-saved-checked for a checkbox): the draft is then unsaved
  // from the start, and Discard goes back to what is saved. `all`: disabled fields too (a
  // page read again, where nothing disabled the choices that are not asked for).
  function served(form, all) {
    var params = new URLSearchParams();
    Array.prototype.forEach.call(form.elements, function (el) {
      if (!el.name || (el.disabled && !all) || el.name === "csrfmiddlewaretoken" || el.name === "revision") return;
      var tag = el.tagName;
      if (tag === "BUTTON" || tag === "FIELDSET" || tag === "OBJECT" || tag === "OUTPUT") return;
      if (el.hasAttribute("data-saved-value")) {
        params.append(el.name, el.getAttribute("data-saved-value"));
        return;
      }
      if (tag === "SELECT") {
        var picked = Array.prototype.filter.call(el.options, function (o) { return o.defaultSelected; });
        if (!picked.length && !el.multiple && el.options.length) picked = [el.options[0]];
        picked.forEach(function (o) { params.append(el.name, o.value); });
        return;
      }
      var type = (el.type || "").toLowerCase();
      if (type === "submit" || type === "button" || type === "reset" || type === "image" || type === "file") return;
      if (type === "checkbox" || type === "radio") {
        var was = el.hasAttribute("data-saved-checked") ? el.getAttribute("data-saved-checked") === "true" : el.defaultChecked;
        if (was) params.append(el.name, el.value || "on");
        return;
      }
      params.append(el.name, el.defaultValue);
    });
    return params.toString();
  }

  // ---- Phone: the bar never covers the field being edited -------------------------
  // With the on-screen keyboard open only the visual viewport shrinks, and a fixed bar
  // stays at the bottom of the layout viewport, behind the keyboard. So the bar follows
  // the visual viewport's bottom edge, and the focused field is scrolled to sit between
  // the top bar and the save bar, focus ring included. When what shows is short (the
  // keyboard open on a phone), the bar is compact (lethe.css): its status in a few words
  // (the whole sentence stays in the bar for screen readers and is announced), no card
  // names, so the field and its error keep the room.
  var RING = 8; // 3px outline + 2px offset + room to breathe
  var COMPACT_BELOW = SHORT_BELOW;
  function shortText(text) {
    var keys = ["failed", "offline", "lost", "lostUnsaved", "sessionEnded", "forbidden"];
    for (var i = 0; i < keys.length; i++) {
      if (text === bar.dataset[keys[i]]) return bar.dataset[keys[i] + "Short"] || text;
    }
    return text;
  }
  function placeBar() {
    var vv = window.visualViewport;
    bar.classList.toggle("is-compact", (vv ? vv.height : window.innerHeight) < COMPACT_BELOW);
    var lift = vv ? Math.max(0, window.innerHeight - (vv.offsetTop + vv.height)) : 0;
    bar.style.transform = lift ? "translateY(" + -lift + "px)" : "";
    var root = document.documentElement;
    root.style.scrollPaddingBottom = bar.hidden ? "" : (bar.offsetHeight + RING) + "px";
    if (!bar.hidden) root.style.setProperty("--save-bar-room", bar.offsetHeight + "px");
  }
  // What shows of the page between the sticky top bar and the save bar (or the screen's end).
  function clearArea() {
    var vv = window.visualViewport;
    var top = (vv ? vv.offsetTop : 0);
    var header = document.querySelector(".topbar");
    if (header && getComputedStyle(header).position === "sticky") top += header.getBoundingClientRect().height;
    var bottom = bar.hidden ? (vv ? vv.offsetTop + vv.height : window.innerHeight) : bar.getBoundingClientRect().top;
    return { top: top, bottom: bottom };
  }
  // Scrolls the least that brings [start, end] (page coordinates of the viewport) into the
  // clear area; what does not fit shows from its start.
  function scrollClear(start, end) {
    var area = clearArea();
    if (end + RING > area.bottom && end - start + 2 * RING <= area.bottom - area.top) {
      window.scrollBy(0, end + RING - area.bottom);
    } else if (start - RING < area.top || end - start + 2 * RING > area.bottom - area.top) {
      window.scrollBy(0, start - RING - area.top);
    }
  }
  // Where a field and its error messages (what describes it, or its group) are on screen.
  function fieldSpan(field) {
    var ids = (field.getAttribute("aria-describedby") || "").split(/\s+/).filter(Boolean);
    var group = field.closest("fieldset");
    if (!ids.length && group) ids = (group.getAttribute("aria-describedby") || "").split(/\s+/).filter(Boolean);
    var box = field.getBoundingClientRect();
    var span = { start: box.top, end: box.bottom };
    ids.forEach(function (id) {
      var message = document.getElementById(id);
      if (!message || !message.classList.contains("field-error")) return;
      var r = message.getBoundingClientRect();
      span.start = Math.min(span.start, r.top);
      span.end = Math.max(span.end, r.bottom);
    });
    return span;
  }
  // The field being edited, and its error if it has one.
  function keepFocusClear() {
    var el = document.activeElement;
    if (bar.hidden || !el || el === document.body || bar.contains(el) || !el.closest("form[data-contributor]")) return;
    var span = fieldSpan(el);
    var area = clearArea();
    if (span.end + RING > area.bottom || span.start - RING < area.top) scrollClear(span.start, span.end);
  }
  // A field refused by a save, with its message: both in the clear area (a card taller than
  // the screen would otherwise put them under the top bar or the save bar).
  function showInvalid(field) {
    field.focus({ preventScroll: true });
    var span = fieldSpan(field);
    scrollClear(span.start, span.end);
  }
  if (window.visualViewport) {
    window.visualViewport.addEventListener("resize", function () { placeBar(); keepFocusClear(); });
    window.visualViewport.addEventListener("scroll", placeBar);
  }
  window.addEventListener("resize", function () { placeBar(); keepFocusClear(); });

  // ---- Saving ----------------------------------------------------------------
  function isLoginPage(url) {
    try { return new URL(url, location.href).pathname === bar.dataset.loginPath; } catch (e) { return false; }
  }
  // A signed-out save is answered 401 (or followed to the login page, or 403 when the
  // form's token went with the session): nothing was saved, and the draft must stay.
  function signedOut(response) {
    return response.status === 401 || response.status === 403 || (response.redirected && isLoginPage(response.url));
  }
  // The page as Lethe renders it now: { doc } (parsed), { unreachable: true } when no answer
  // came, {} for an answer that is not the page (the login page, an error page).
  function readPage() {
    return fetch(location.href, { credentials: "same-origin" }).then(function (response) {
      if (!response.ok || (response.redirected && isLoginPage(response.url))) return {};
      return response.text().then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        return doc.querySelector("input[name=csrfmiddlewaretoken]") ? { doc: doc } : {};
      });
    }).catch(function () { return { unreachable: true }; });
  }
  // After signing in again elsewhere the page's CSRF token is stale: the page's fresh one.
  function takeToken(doc) {
    var token = doc.querySelector("input[name=csrfmiddlewaretoken]");
    document.querySelectorAll("input[name=csrfmiddlewaretoken]").forEach(function (el) { el.value = token.value; });
    var headers = doc.body.getAttribute("hx-headers");
    if (headers) document.body.setAttribute("hx-headers", headers);
  }

  // "ok" once the page's token is good for the session (renewed first after a session ended),
  // else "session", or "unreachable" when the page could not be read to renew it: then
  // nothing was sent, and "nothing was done" is true.
  function fresh() {
    if (!sessionEnded && !tokenStale) return Promise.resolve("ok");
    return readPage().then(function (read) {
      if (!read.doc) return read.unreachable ? "unreachable" : "session";
      takeToken(read.doc);
      tokenStale = false;
      return "ok";
    });
  }

  // A save whose answer did not arrive was sent: Lethe may have saved it (r122: the bar said
  // "nothing was saved" while cleanup had been switched on, and the daily check then removed
  // tool details for good). Such a card's saved settings are read again from the page, and
  // compared with the draft that was sent: "saved" (the card shows them, the draft is gone),
  // "unsaved" (the draft stays), or "unknown" when the page cannot be read either: the card
  // is then `uncertain`, and its next save reads first, so a save that went through is not
  // sent again from a revision that is behind.
  var uncertain = {};
  function settleLost(lost) {
    return readPage().then(function (read) {
      var outcome = {};
      if (read.doc) takeToken(read.doc);
      lost.forEach(function (form) {
        var key = form.dataset.contributor;
        var now = read.doc && read.doc.querySelector('form[data-contributor="' + key + '"]');
        if (!now) {
          uncertain[key] = true;
          outcome[key] = "unknown";
          return;
        }
        delete uncertain[key];
        outcome[key] = sameAsStored(form, now) ? "saved" : "unsaved";
        if (outcome[key] === "saved") showStored(form, now, bar.dataset.lostSaved);
      });
      return outcome;
    });
  }
  // Whether the draft in `form` is what `stored` (the card's form as Lethe renders it now)
  // holds: every setting it shows (not a choice it asks for only with a change, hidden).
  function sameAsStored(form, stored) {
    var now = new URLSearchParams(served(stored, true));
    var draft = new URLSearchParams(snapshot(form));
    var names = [];
    Array.prototype.forEach.call(stored.elements, function (el) {
      if (!el.name || el.name === "csrfmiddlewaretoken" || el.name === "revision" || el.tagName === "BUTTON" ||
          el.closest("fieldset[hidden]") || names.indexOf(el.name) !== -1) return;
      names.push(el.name);
    });
    return names.length > 0 && names.every(function (name) {
      var a = now.getAll(name), b = draft.getAll(name);
      var number = (stored.elements.namedItem(name) || {}).type === "number";
      return a.length === b.length && a.every(function (value, i) {
        return number ? value !== "" && Number(value) === Number(b[i]) : value === b[i];
      });
    });
  }
  // The card as the page read again renders it; `note`: a confirmation, where a save puts its own.
  function showStored(form, stored, note) {
    var card = form.closest("section") || form;
    var focusedId = card.contains(document.activeElement) ? document.activeElement.id : "";
    var fresh = document.importNode(stored.closest("section") || stored, true);
    if (note) {
      var said = document.createElement("p");
      said.className = "alert alert-ok";
      said.setAttribute("role", "status");
      said.setAttribute("data-testid", "lost-saved");
      said.textContent = note;
      var before = fresh.querySelector(".live-note") || fresh.querySelector("form[data-contributor]");
      if (before) before.parentNode.insertBefore(said, before);
    }
    putCard(card, fresh, form.dataset.contributor, focusedId, true);
  }
  // A card replaced by the one Lethe rendered (`fresh`): its form known, its state the saved
  // one when `isSaved` (a refused save keeps the earlier saved state), the focus kept by id.
  function putCard(card, fresh, key, focusedId, isSaved) {
    card.replaceWith(fresh);
    if (window.htmx) window.htmx.process(fresh);
    syncCleanupDraft();
    var newForm = fresh.querySelector('form[data-contributor="' + key + '"]');
    known.add(newForm);
    if (isSaved) remember(newForm);
    var again = focusedId && document.getElementById(focusedId);
    if (again && focusLost()) again.focus({ preventScroll: true });
  }

  function saveOne(form) {
    var card = form.closest("section") || form;
    var key = form.dataset.contributor;
    var focusedId = card.contains(document.activeElement) ? document.activeElement.id : "";
    return fetch(form.action, {
      method: "POST",
      body: new FormData(form),
      headers: { "HX-Request": "true", "HX-Current-URL": location.href },
      credentials: "same-origin",
    }).then(function (response) {
      // Refused for who is signed in (no longer an admin), not a session that ended.
      if (response.status === 403 && response.headers.get("X-Lethe-Refused") === "not-admin") return "forbidden";
      if (signedOut(response)) return "session";
      return response.text().then(function (html) {
        var holder = document.createElement("div");
        holder.innerHTML = html.trim();
        var fresh = holder.firstElementChild;
        // Not Lethe's answer (a proxy's error page, its 504 after Lethe saved): as lost.
        if (!fresh || !fresh.querySelector('form[data-contributor="' + key + '"]')) return "lost";
        if (!response.ok) fresh.classList.add("has-error");
        putCard(card, fresh, key, focusedId, response.ok);
        return response.ok ? "saved" : "failed";
      });
    }).catch(function () { return "lost"; });
  }

  // The bar's Save saves every card with changes; a key pressed in a card (Enter) saves only
  // that card (`only`), as the browser does without this script: one card's draft is never
  // saved by a keystroke in the other (r39: Enter in a period switched cleanup on).
  function saveAll(only) {
    var dirty = dirtyForms().filter(function (f) { return !only || f === only; });
    if (!dirty.length || busy) return Promise.resolve();
    busy = true;
    bar.classList.add("is-busy");
    var barHadFocus = bar.contains(document.activeElement);
    return fresh().then(function (ready) {
      if (ready !== "ok") return dirty.map(function () { return ready === "unreachable" ? "offline" : "session"; });
      var unsure = dirty.filter(function (f) { return uncertain[f.dataset.contributor]; });
      return (unsure.length ? settleLost(unsure) : Promise.resolve({})).then(function (settled) {
        return Promise.all(dirty.map(function (f) {
          var was = settled[f.dataset.contributor];
          return was === "saved" || was === "unknown" ? was : saveOne(f);
        }));
      });
    }).then(function (results) {
      var lost = dirty.filter(function (f, i) { return results[i] === "lost"; });
      if (!lost.length) return results;
      return settleLost(lost).then(function (settled) {
        return results.map(function (r, i) { return r === "lost" ? settled[dirty[i].dataset.contributor] : r; });
      });
    }).then(function (results) {
      busy = false;
      bar.classList.remove("is-busy");
      // A save that reached the server proves the session good (r43: after one card saved, the
      // bar, up for the other card, still said the session had ended and nothing was saved).
      if (results.indexOf("session") === -1 && results.indexOf("offline") === -1) sessionEnded = false;
      if (results.indexOf("session") !== -1) {
        sessionEnded = true;
        refresh();
        announce(live, bar.dataset.sessionEnded);
        if (barHadFocus && signIn) signIn.focus();
        return;
      }
      if (results.indexOf("forbidden") !== -1) {
        refresh(bar.dataset.forbidden);
        announce(live, bar.dataset.forbidden);
        return;
      }
      if (results.indexOf("failed") !== -1) {
        refresh(bar.dataset.failed);
        announce(live, bar.dataset.failed);
        // Take the person to what needs fixing.
        var card = document.querySelector(".card.has-error");
        var field = card && (card.querySelector("[aria-invalid=true]:not([disabled])") ||
          card.querySelector("input:not([type=hidden]):not([disabled]), select:not([disabled])"));
        if (field) showInvalid(field);
        else if (card) focusQuiet(card);
        return;
      }
      // (A lost answer is "unknown" or "unsaved" by now: read again, or not readable either.)
      var said = ["unknown", "unsaved", "offline"].filter(function (r) { return results.indexOf(r) !== -1; })[0];
      if (said) {
        var words = bar.dataset[{ unknown: "lost", unsaved: "lostUnsaved", offline: "offline" }[said]];
        refresh(words);
        announce(live, words);
        return;
      }
      refresh();
      var confirmations = document.querySelectorAll(".card [role=status]");
      if ((focusLost() || barHadFocus) && confirmations.length) {
        // The bar hid with the focus on it: move to the result, the first confirmation, which
        // is then what is read (with the bar's "Changes saved." as well it was said twice, r19);
        // the bar's words only when more than one card was saved.
        focusQuiet(confirmations[0]);
        if (confirmations.length > 1) announce(live, bar.dataset.saved);
      } else {
        announce(live, bar.dataset.saved);
      }
    });
  }

  // Discard on the bar: every card; Escape in a card: that card only (`only`).
  function discard(only) {
    var barHadFocus = bar.contains(document.activeElement);
    var had = document.activeElement;
    var card = only ? only.closest("section") : lastField && lastField.closest("section");
    var discarded = dirtyForms().filter(function (f) { return !only || f === only; });
    discarded.forEach(function (f) { restore(f, saved[f.dataset.contributor]); });
    // A card whose save may have gone through: what it had before is not surely what is
    // saved, so it shows what the page read again has, once that can be read.
    var unsure = discarded.filter(function (f) { return uncertain[f.dataset.contributor]; });
    if (unsure.length) {
      readPage().then(function (read) {
        if (!read.doc) return;
        takeToken(read.doc);
        unsure.forEach(function (f) {
          var key = f.dataset.contributor;
          var now = read.doc.querySelector('form[data-contributor="' + key + '"]');
          if (!now || !document.body.contains(f) || dirtyForms().indexOf(f) !== -1) return;
          delete uncertain[key];
          showStored(f, now);
        });
        refresh();
      });
    }
    if (!only) document.querySelectorAll(".card.has-error").forEach(function (c) { c.classList.remove("has-error"); });
    syncCleanupDraft(); // what depends on the fields (the backup choice, the estimate's mark)
    // One card discarded: the other's draft still waits for a sign-in, and the next save must
    // renew the page's token first (r43: Escape in one card hid the sign-in link, and the save
    // after signing in again was refused). refresh() forgets it once nothing is left to save.
    if (!only) sessionEnded = false;
    refresh();
    announce(live, bar.dataset.discarded);
    // A field the discard hid or turned off (the backup choice, with cleanup off again) loses
    // the focus only after this runs (r147: Escape on its radio left the focus on the page)
    var hidden = had && had !== document.body && (had.disabled || !had.getClientRects().length);
    if (barHadFocus || focusLost() || hidden) focusQuiet(card);
  }

  forms().forEach(function (form) { saved[form.dataset.contributor] = served(form); known.add(form); });
  // Back or Forward to this page: a browser may fill the cards' fields with what they held when
  // the person left, after this script recorded what is saved (r121: a draft left behind came
  // back looking saved, the bar hidden and the revision current, and the next save wrote it over
  // another admin's). The forms say autocomplete="off"; a browser that fills them anyway sees
  // them put back as the server rendered them.
  window.addEventListener("pageshow", function (event) {
    var entries = event.persisted || !performance.getEntriesByType ? [] : performance.getEntriesByType("navigation");
    if (!entries.length || entries[0].type !== "back_forward") return;
    forms().forEach(function (form) { form.reset(); });
    syncCleanupDraft();
    refresh();
  });
  // A card swapped in by an action (cancelling a preparation turns cleanup off) shows what
  // is saved now, so its form, one this script has not seen, is that card's saved state.
  document.addEventListener("htmx:oobAfterSwap", function () {
    var fresh = forms().filter(function (form) { return !known.has(form); });
    if (!fresh.length) return;
    fresh.forEach(function (form) { known.add(form); remember(form); });
    refresh();
  });
  // Another admin's save, read by a status poll (#tool-saved): the cleanup form, when this
  // person has not changed it, follows the saved policy (switch, period, revision), so the
  // page never shows a switch that says the opposite of the status beside it. A form being
  // edited keeps its draft; its save is then refused as stale, with the reason.
  function followSavedPolicy() {
    var policy = document.getElementById("tool-saved");
    var form = document.querySelector('form[data-contributor="tool"]');
    var revision = form && form.querySelector("input[name=revision]");
    if (!policy || !policy.dataset.revision || !revision || revision.value === policy.dataset.revision) return;
    if (!known.has(form) || snapshot(form) !== saved.tool) return;
    var fields = new URLSearchParams({ age_value: policy.dataset.ageValue, age_unit: policy.dataset.ageUnit });
    if (policy.dataset.enabled === "true") fields.append("enabled", "on");
    restore(form, fields.toString());
    revision.value = policy.dataset.revision;
    var choice = document.getElementById("backup-choice");
    if (choice) {
      choice.dataset.savedEnabled = policy.dataset.enabled;
      choice.dataset.savedAge = policy.dataset.ageValue;
      choice.dataset.savedUnit = policy.dataset.ageUnit;
    }
    syncCleanupDraft();
    remember(form);
    refresh();
  }
  document.addEventListener("htmx:oobAfterSwap", followSavedPolicy);
  document.addEventListener("focusin", function (event) {
    if (event.target.closest && event.target.closest("form[data-contributor]")) {
      lastField = event.target;
      keepFocusClear();
    }
  });
  document.addEventListener("input", function () { refresh(); });
  document.addEventListener("change", function () { refresh(); });
  document.addEventListener("submit", function (event) {
    if (event.target.matches("form[data-contributor]")) {
      event.preventDefault();
      saveAll(event.target);
    }
  });
  document.addEventListener("keydown", function (event) {
    // Enter on a checkbox or a radio of a card being edited saves, as it does in a text field
    // (browsers submit only from those), so the keyboard need not go round to the bar.
    var el = event.target;
    if (event.key !== "Enter" || busy || event.defaultPrevented || !el.matches ||
        !el.matches("form[data-contributor] input[type=checkbox], form[data-contributor] input[type=radio]")) return;
    var form = el.closest("form[data-contributor]");
    if (dirtyForms().indexOf(form) === -1) return;
    event.preventDefault();
    saveAll(form);
  });
  document.addEventListener("keydown", function (event) {
    // Escape in a card being edited discards that card; on the bar, every card (as its Discard).
    if (event.key !== "Escape" || bar.hidden || busy || event.defaultPrevented) return;
    var form = !bar.contains(event.target) && event.target.closest && event.target.closest("form[data-contributor]");
    if (!form && !bar.contains(event.target)) return;
    if (form ? dirtyForms().indexOf(form) === -1 : !dirtyForms().length) return;
    event.preventDefault();
    discard(form || undefined);
  });
  bar.addEventListener("click", function (event) {
    var action = event.target.closest("[data-save-bar]");
    if (!action) return;
    if (action.dataset.saveBar === "save") saveAll();
    else discard();
  });
  // ---- The cleanup card's in-place actions and status reads after the session ended --------
  // They are answered 401 with the way to the login page (console/viewer.py). Followed, it
  // left the page and the unsaved draft the action was pressed with (Analyze savings sends the
  // period being edited): the browser's leave-page prompt, then the saved settings on the way
  // back (r76). Instead an action says beside its button that nothing was done, with the way
  // to sign in in a new tab; a status read while a draft waits says so beside the status. The
  // draft stays, and the next action (or save) renews the page's token first.
  function sayAlert(region, text) {
    region.innerHTML = "";
    var p = document.createElement("p");
    p.className = "alert alert-error";
    p.textContent = text;
    region.appendChild(p);
    return p;
  }
  function saySignedOut(region, focus) {
    if (!region || region.querySelector("[data-said-session-ended]")) return; // said once, its link kept
    var p = sayAlert(region, region.dataset.sessionEnded + " ");
    p.setAttribute("data-said-session-ended", "");
    if (signIn) {
      var link = signIn.cloneNode(true);
      link.hidden = false;
      link.classList.remove("save-bar-signin"); // (a whole button: a 44 px target on a phone)
      p.appendChild(link);
    }
    // The way on, for the button pressed: it is earlier in the page than that button (r80: 35
    // presses of Tab away), so the focus goes to it, as the save bar's does.
    if (focus && p.querySelector("a")) p.querySelector("a").focus();
  }
  // The cleanup card's action a request came from (its status poll carries data-cleanup-action
  // too, for its error answers: it is no action).
  function cleanupAction(elt) {
    return elt && elt.closest && elt.id !== "tool-poll" ? elt.closest("[data-cleanup-action]") : null;
  }
  function actionRegion(elt) {
    var press = pressed && pressed.elt === elt ? pressed.region : null; // (a button gone since: its region then)
    return document.getElementById(press || (elt.closest("#db-compact") ? "compact-error" : "tool-action-error"));
  }
  document.addEventListener("htmx:beforeOnLoad", signedOutAnswer);
  function signedOutAnswer(event) {
    var elt = event.detail.elt;
    var xhr = event.detail.xhr;
    var action = cleanupAction(elt);
    if (xhr.status === 401 && (action || (elt && elt.id === "tool-poll" && dirtyForms().length))) {
      event.preventDefault();
      tokenStale = true; // said beside the action, once: the bar keeps saying what is unsaved
      saySignedOut(action ? actionRegion(elt) : document.getElementById("tool-status-note"),
                   action && elt.contains(document.activeElement));
    } else if (action && xhr.status === 403 && !xhr.getResponseHeader("X-Lethe-Refused") &&
               (xhr.responseText || "").indexOf("hx-swap-oob") === -1) {
      // The page's token was refused: signed in again in another tab since it was loaded (a new
      // session has a new token). Nothing was done; the next press renews the token first.
      event.preventDefault();
      tokenStale = true;
      var region = actionRegion(elt);
      if (region) sayAlert(region, region.dataset.tokenExpired);
    }
  }
  var renewing = false;
  document.addEventListener("htmx:confirm", function (event) {
    var elt = event.detail.elt;
    if (!(sessionEnded || tokenStale) || !cleanupAction(elt)) return;
    event.preventDefault();
    if (renewing) return; // a second press while the token renews is dropped, as hx-sync drops it (r77)
    renewing = true;
    fresh().then(function (ready) {
      renewing = false;
      if (ready === "ok") {
        sessionEnded = false;
        refresh();
        ["tool-action-error", "compact-error", "tool-status-note"].forEach(function (id) {
          var region = document.getElementById(id);
          if (region && region.querySelector("[data-said-session-ended]")) region.innerHTML = "";
        });
        event.detail.issueRequest(true);
      } else if (ready === "unreachable") {
        // Not sent: the page could not be read for a fresh token, so nothing was done.
        var unreached = actionRegion(elt);
        if (unreached) sayAlert(unreached, unreached.dataset.offline);
      } else {
        var region = actionRegion(elt);
        if (region) region.innerHTML = ""; // said again: this press did nothing either
        saySignedOut(region, elt.contains(document.activeElement));
      }
    });
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
