# placeholder: written by the kernel's author
