// Small behaviours of the console; every page works without them.
// Handlers are delegated from the document, so content htmx swaps in behaves the same.

// <button data-confirm="Question?">: ask before the click does anything.
document.addEventListener(
  "click",
  (event) => {
    const button = event.target.closest("[data-confirm]");
    if (button && !window.confirm(button.dataset.confirm)) {
      event.preventDefault();
      event.stopImmediatePropagation();
    }
  },
  true,
);

// <button data-copy="#field">: copy that field's value to the clipboard.
document.addEventListener("click", async (event) => {
  const button = event.target.closest("[data-copy]");
  if (!button) return;
  const field = document.querySelector(button.dataset.copy);
  field.select();
  try {
    await navigator.clipboard.writeText(field.value);
    button.textContent = "Copied";
  } catch {
    button.textContent = "Press Ctrl+C";
  }
});

// <input data-select>: select the whole value on click, ready to copy.
document.addEventListener("click", (event) => {
  const field = event.target.closest("input[data-select]");
  if (field) field.select();
});

// <button data-fill="#field" data-value="text">: put the text into that field.
document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-fill]");
  if (!button) return;
  const field = document.querySelector(button.dataset.fill);
  field.value = button.dataset.value;
  field.focus();
});

// <input data-only-with="other=value">: the field (and its label) shows, and is sent, only while
// its form's field `other` has that value. A field the server marked invalid stays visible.
function syncDependentFields(form) {
  for (const field of form.querySelectorAll("[data-only-with]")) {
    const [name, value] = field.dataset.onlyWith.split("=");
    const shown = form.elements[name]?.value === value || field.getAttribute("aria-invalid") === "true";
    (field.closest("label") ?? field).hidden = !shown;
    field.disabled = !shown;
  }
}

function syncAllDependentFields() {
  for (const form of document.forms) {
    if (form.querySelector("[data-only-with]")) syncDependentFields(form);
  }
}

document.addEventListener("change", (event) => {
  if (event.target.form) syncDependentFields(event.target.form);
});
document.addEventListener("htmx:afterSwap", syncAllDependentFields);
syncAllDependentFields();
