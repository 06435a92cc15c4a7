// Runs before the page paints (loaded without defer): mark that JavaScript is on.
// A file of its own because the Content-Security-Policy allows no inline script.
document.documentElement.classList.replace("no-js", "js");
